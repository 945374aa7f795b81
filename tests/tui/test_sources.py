"""xtop's data layer over the two real contracts: a clusterx database and a deeptrace run directory."""

import time
from pathlib import Path

import orjson
from clusterx import Client
from clusterx.backends.fake import write_fake_state
from clusterx.spec import JobSpec
from deeptrace.collect import Collector
from deeptrace.report.model import load_report
from deeptrace.rundir import RunWriter, layout
from xtop.resources import sample_resources
from xtop.sources import JobSource, RunSource, summarize_report


def test_run_source_follows_metrics_as_they_grow(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with RunWriter(run_dir, rank=0, world_size=1) as writer:
        writer.append_metrics(1, loss=5.5, tokens_per_s=1000.0)
        source = RunSource(run_dir)
        first = source.poll()
        assert first.steps_seen == 1
        assert first.last_metrics["loss"] == 5.5
        writer.append_metrics(2, loss=4.25, tokens_per_s=1100.0)
        writer.append_metrics(3, loss=4.0, tokens_per_s=1200.0)
    second = source.poll()
    assert second.steps_seen == 3
    assert second.last_metrics["step"] == 3
    assert second.last_metrics["loss"] == 4.0


def test_run_source_tolerates_a_half_written_line_and_names_a_corrupt_one(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    metrics = layout.metrics_path(run_dir)
    metrics.write_bytes(b'{"step": 1, "loss": 3.0}\n{"step": 2, "lo')
    source = RunSource(run_dir)
    snap = source.poll()
    assert (snap.steps_seen, snap.problems) == (1, [])
    with metrics.open("ab") as handle:
        handle.write(b'ss": 2.5}\nnot json\n')
    snap = source.poll()
    assert snap.last_metrics == {"step": 2, "loss": 2.5}
    snap = source.poll()
    assert len(snap.problems) == 1
    assert str(metrics) in snap.problems[0]
    assert ":3" in snap.problems[0]  # the line number of the corrupt line


def test_run_source_reports_rank_liveness_from_heartbeats(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    collector = Collector(run_dir, rank=0, world_size=1, heartbeat_interval_s=None)
    collector.step_begin(7)
    collector.step_end(7)
    collector.close()
    snap = RunSource(run_dir).poll(now_wall_s=time.time() + 120)
    assert [(r.rank, r.step, r.state) for r in snap.ranks] == [(0, 7, "closed")]
    assert snap.ranks[0].seconds_since_progress >= 119


def _rank(overlap: float | None, exposed: float | None) -> dict[str, object]:
    parts = ("window_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "memory_ms", "other_ms", "idle_ms")
    window = dict.fromkeys(parts, 1.0)
    return {
        "source": "collector", "path": "trace/rank-0.dtr", "timing": "spans", "timing_note": None,
        "overlap_pct": overlap, "exposed_comm_ms_per_step": exposed, "breakdown": window, "steps": [],
        "kernels": {}, "unclassified_kernels": {}, "clock_offset_ms": 0.0,
        "collectives": {"count": 0, "matched": 0, "arrived_last": 0, "last_arrival_share": None,
                        "caused_wait_ms": 0.0, "waited_ms": 0.0},
    }  # fmt: skip


def _report(**changes: object) -> dict[str, object]:
    """A complete report.json object of schema version 1 (what `deeptrace analyze` writes)."""
    report: dict[str, object] = {
        "schema": "deeptrace.report", "schema_version": 1, "deeptrace_version": "0.1.0",
        "created": "2026-12-01T00:00:00Z", "run_dir": "run", "inputs": [],
        "earlier_attempts": [{"rank": 1, "attempt": 1, "path": "trace/rank-1.attempt-1.dtr"}],
        "ranks": {"0": _rank(80.0, 1.5), "1": _rank(None, None)},
        "collectives": {"matched": 0, "matched_by": {"seq": 0, "order": 0},
                        "skew_ms": {"median": None, "p95": None, "max": None}, "per_collective": [],
                        "per_collective_truncated": False, "worst": []},
        "clock": {"applied": True, "reference_rank": 0, "method": "m", "offsets_ms": {}},
        "stragglers": {"verdict": "straggler", "explanation": "rank 1 arrives last", "matched_collectives": 9,
                       "waiting_ranks": [], "culprits": [{"rank": 1, "last_arrival_share": 0.9, "arrived_last": 8,
                       "collectives": 9, "mean_lateness_ms": 2.0, "caused_wait_ms": 9.0, "steps_recurring": 3,
                       "steps_total": 3, "evidence": "e"}]},
        "hang": None,
        "warnings": ["rank 1: no communication kernel"],
    }  # fmt: skip
    report.update(changes)
    return report


def test_run_source_shows_deeptrace_findings(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / layout.REPORT_DIR).mkdir(parents=True)
    report = _report()
    (run_dir / layout.REPORT_DIR / "report.json").write_bytes(orjson.dumps(report))
    findings = RunSource(run_dir).poll().findings
    assert findings == summarize_report(load_report(report))
    assert "rank 0: overlap 80.0%, exposed comm 1.50 ms/step" in findings
    assert "rank 1: overlap n/a, exposed comm n/a" in findings
    assert any(line.startswith("straggler: rank 1") for line in findings)
    assert "rank 1: earlier attempt 1 set aside (not analysed)" in findings
    assert "warning: rank 1: no communication kernel" in findings


def test_run_source_names_a_report_of_a_newer_schema_instead_of_misreading_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / layout.REPORT_DIR).mkdir(parents=True)
    path = run_dir / layout.REPORT_DIR / "report.json"
    path.write_bytes(orjson.dumps(_report(schema_version=2)))
    snap = RunSource(run_dir).poll()
    assert snap.findings == []
    assert snap.problems == [
        f"{path}: report schema version 2 is newer than this deeptrace reads (1): upgrade deeptrace"
    ]
    path.write_bytes(orjson.dumps(_report(ranks={"0": {"overlap_pct": "high"}})))
    problem = RunSource(run_dir).poll().problems[0]
    assert problem.startswith(f"{path}: field ranks.0.")


def test_job_source_lists_newest_jobs_with_their_state(tmp_path: Path) -> None:
    db = str(tmp_path / "jobs.db")
    fake_dir = tmp_path / "fake"
    client = Client(db)
    ids = []
    for name in ("first", "second"):
        spec = JobSpec(name=name, command=["true"], backend="fake", backend_options={"state_dir": str(fake_dir)})
        ids.append(client.submit(spec)["id"])
    backend_id = client.describe(ids[0], poll=False)["backend_job_id"]
    write_fake_state(fake_dir, backend_id, {"state": "RUNNING", "raw_state": "FAKE_RUNNING"})
    client.close()
    source = JobSource(db)
    jobs = source.jobs()
    source.close()
    assert [job["name"] for job in jobs] == ["second", "first"]
    assert jobs[1]["state"] == "RUNNING"


def test_resources_match_the_machine() -> None:
    sample = sample_resources()
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    total_kib = int(meminfo["MemTotal"].split()[0])
    assert sample.memory_total_bytes == total_kib * 1024
    assert 0 < sample.memory_used_bytes < sample.memory_total_bytes
    assert sample.cpu_count >= 1
    # No NVIDIA driver on the CI machines: no GPU, and a reason instead of an error.
    if not sample.gpus:
        assert sample.gpu_note


def test_one_unreadable_heartbeat_does_not_hide_the_others(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    for rank in (0, 1):
        collector = Collector(run_dir, rank=rank, world_size=2, heartbeat_interval_s=None)
        collector.step_begin(3)
        collector.close()
    broken = layout.heartbeat_path(run_dir, 1)
    broken.write_text('{"rank": 1, "wor')
    snap = RunSource(run_dir).poll()
    assert [r.rank for r in snap.ranks] == [0]
    assert len(snap.problems) == 1 and str(broken) in snap.problems[0]
