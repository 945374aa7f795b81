"""`deeptrace analyze` end to end through the CLI: outputs, --json, --merge, --fail-on, --output, --classify."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from deeptrace.cli import main

from tests.deeptrace.kineto_builders import allreduce_ranks, write_ranks


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["analyze", *args], catch_exceptions=False)


@pytest.fixture
def straggler_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "traces"
    traces = allreduce_ranks(3, steps=2, per_step=3, slow_rank=1, late_us=4000, clock_skew_us={2: 50_000})
    write_ranks(traces, folder, suffix=".json.gz")
    return folder


def test_shared_kineto_folder_to_output_dir(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run(str(shared_data / "kineto"), "--output", str(out))
    assert result.exit_code == 0, result.output
    assert "Per rank" in result.stdout and "Stragglers" in result.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["schema"] == "deeptrace.report" and report["schema_version"] == 1
    assert report["ranks"]["0"]["overlap_pct"] == pytest.approx(11.81, abs=0.01)
    assert set(report["ranks"]["1"]["breakdown"]) >= {"compute_ms", "exposed_comm_ms", "memory_ms", "idle_ms"}
    assert "stragglers" in report and "hang" in report and isinstance(report["warnings"], list)
    assert (out / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| rank |" in (out / "report.md").read_text()


def test_read_only_run_dir_says_use_output(shared_data: Path) -> None:
    result = run(str(shared_data / "kineto"))
    assert result.exit_code == 2
    assert "read-only" in result.stderr and "--output" in result.stderr
    assert not (shared_data / "kineto" / "deeptrace").exists()


def test_json_to_stdout_and_default_output_place(straggler_dir: Path) -> None:
    result = run(str(straggler_dir), "--json")
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed == json.loads((straggler_dir / "deeptrace" / "report.json").read_text())
    assert printed["stragglers"]["culprits"][0]["rank"] == 1
    assert printed["ranks"]["2"]["clock_offset_ms"] == pytest.approx(50.0, abs=0.001)


@pytest.mark.parametrize(
    ("rules", "code"),
    [
        ("straggler", 1),
        ("overlap<50", 1),
        ("overlap<0", 0),
        ("overlap<=0", 1),
        ("hang", 0),
        ("skew>3.9", 1),
        ("skew>4.1", 0),
        ("exposed>100,hang", 0),
    ],
)
def test_fail_on_rules(straggler_dir: Path, tmp_path: Path, rules: str, code: int) -> None:
    result = run(str(straggler_dir), "--fail-on", rules, "-o", str(tmp_path / "o"), "--no-png")
    assert result.exit_code == code, result.output
    if code:
        assert "--fail-on" in result.stderr


def test_bad_rule_is_a_usage_error(straggler_dir: Path) -> None:
    result = run(str(straggler_dir), "--fail-on", "overlap<<3")
    assert result.exit_code == 2 and "allowed" in result.stderr


def test_merge_writes_one_process_per_rank_with_corrected_clocks(straggler_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert run(str(straggler_dir), "--merge", "-o", str(out), "--no-png").exit_code == 0
    merged = json.loads((out / "merged_trace.json").read_text())
    assert merged["otherData"]["clock_offsets_ns"]["2"] == pytest.approx(50_000_000, abs=1000)
    events = merged["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1", 2: "rank 2"}
    # The first all-reduce ends at the same true time on every rank: after correction, at the same ts.
    ends = {}
    for e in events:
        if e["ph"] == "X" and e["name"].startswith("nccl") and e["pid"] not in ends:
            ends[e["pid"]] = e["ts"] + e["dur"]
    assert max(ends.values()) - min(ends.values()) < 0.01  # microseconds


def test_classify_option(tmp_path: Path) -> None:
    traces = allreduce_ranks(1, steps=1, per_step=2)
    write_ranks(traces, tmp_path / "t")
    config = tmp_path / "c.toml"
    config.write_text("comm = ['^nothing_matches']\n")
    result = run(str(tmp_path / "t"), "--classify", str(config), "--json", "--no-png")
    report = json.loads(result.stdout)
    assert report["ranks"]["0"]["overlap_pct"] is None  # NCCL kernels now unclassified
    assert report["ranks"]["0"]["kernels"]["other"] == 2


def test_help_does_not_import_numpy_or_matplotlib() -> None:
    code = (
        "import sys; from click.testing import CliRunner; from deeptrace.cli import main;"
        "r = CliRunner().invoke(main, ['analyze', '--help']); assert r.exit_code == 0;"
        "assert not {'numpy', 'matplotlib'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_terminal_report_stays_short_with_many_ranks(straggler_dir: Path) -> None:
    from deeptrace.analysis.run import analyse_run
    from deeptrace.report.schema import build_report
    from deeptrace.report.terminal import render_terminal
    from rich.console import Console

    report = build_report(analyse_run(straggler_dir, jobs=1))
    one = report.ranks["1"]
    report = report.model_copy(update={"ranks": {str(r): one for r in range(100)}})
    console = Console(record=True, width=120)
    render_terminal(report, console)
    text = console.export_text()
    assert "Per-step figures of 100 ranks" in text
    assert "the 32 ranks that caused the most waiting" in text
    assert len(text.splitlines()) < 200


def test_cpu_only_run_dir_reports_overlap_and_how_it_was_read(tmp_path: Path) -> None:
    # The real gloo traces of tests/deeptrace/data, where xtrain writes them: RUN_DIR/profiler/rank-R.json(.gz).
    profiler = tmp_path / "run" / "profiler"
    profiler.mkdir(parents=True)
    for rank in (0, 1):
        name = f"gloo-fsdp2-cpu-rank-{rank}.json.gz"
        (profiler / f"rank-{rank}.json.gz").write_bytes((Path(__file__).parent / "data" / name).read_bytes())
    result = run(str(tmp_path / "run"), "--json", "--no-png", "--jobs", "1")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    for rank in ("0", "1"):
        r = report["ranks"][rank]
        assert r["source"] == "kineto" and r["timing"] == "cpu"
        assert r["overlap_pct"] > 0 and r["exposed_comm_ms_per_step"] > 0
        assert "CPU-only trace" in r["timing_note"]
    assert report["collectives"]["matched"] == 41
    assert "nothing to analyse" not in result.stderr
    assert "(CPU)" in (tmp_path / "run" / "deeptrace" / "report.md").read_text()
