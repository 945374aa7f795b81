"""xtop's data layer over the two real contracts: a clusterx database and a deeptrace run directory."""

import time
from pathlib import Path

import orjson
from clusterx import Client
from clusterx.backends.fake import write_fake_state
from clusterx.spec import JobSpec
from deeptrace.collect import Collector
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


def test_run_source_shows_deeptrace_findings(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / layout.REPORT_DIR).mkdir(parents=True)
    report = {
        "ranks": {"0": {"overlap_pct": 80.0, "exposed_comm_ms_per_step": 1.5}, "1": {"overlap_pct": None}},
        "stragglers": {"verdict": "straggler", "culprits": [{"rank": 1}], "explanation": "rank 1 arrives last"},
        "hang": None,
        "warnings": ["rank 1: no communication kernel"],
    }
    (run_dir / layout.REPORT_DIR / "report.json").write_bytes(orjson.dumps(report))
    findings = RunSource(run_dir).poll().findings
    assert findings == summarize_report(report)
    assert "rank 0: overlap 80.0%, exposed comm 1.50 ms/step" in findings
    assert "rank 1: overlap n/a, exposed comm n/a" in findings
    assert any(line.startswith("straggler: rank 1") for line in findings)
    assert "warning: rank 1: no communication kernel" in findings


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
