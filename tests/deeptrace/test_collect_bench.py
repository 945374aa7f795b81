"""The overhead benchmark runs and ends with its one JSON line (its figures are for docs, not for asserts)."""

from __future__ import annotations

import json
import subprocess
import sys

from deeptrace.collect.native import native_module

from tests.conftest import REPO_ROOT


def test_collector_overhead_benchmark_prints_its_json_line() -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "tools/bench/collector_overhead.py"),
            "--steps",
            "2",
            "--layers",
            "2",
            "--tight-spans",
            "2000",
            "--repeats",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"overhead_pct", "overhead_pct_paired", "ns_per_span", "step_ms"} <= set(figures)
    assert figures["ns_per_span"] > 0 and figures["spans_per_step"] == 2 * 2 * 5 + 2
    low, high = figures["overhead_pct_paired_ci95"]
    assert low <= figures["overhead_pct_paired"] <= high
    # Where the C hot path is built (the test of test_collect_native.py makes sure it is), the Python contexts are
    # measured in the same run.
    if native_module() is not None:
        assert figures["hot_path"] == "native"
        assert figures["python_ns_per_span"] > 0 and "python_overhead_pct_paired" in figures


def test_repeats_report_the_median_over_fresh_processes() -> None:
    command = [sys.executable, str(REPO_ROOT / "tools/bench/collector_overhead.py")]
    small = ["--steps", "2", "--layers", "1", "--tight-spans", "200"]
    result = subprocess.run(
        [*command, *small, "--repeats", "3"], capture_output=True, text=True, timeout=300, check=True
    )
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    each = [json.loads(line) for line in result.stderr.strip().splitlines() if line.startswith("{")]
    assert figures["runs"] == 3 and len(each) == 3
    assert figures["overhead_pct_runs"] == [run["overhead_pct"] for run in each]
    assert figures["overhead_pct"] == sorted(run["overhead_pct"] for run in each)[1]
    assert figures["overhead_pct_range"] == [min(figures["overhead_pct_runs"]), max(figures["overhead_pct_runs"])]
    assert figures["target_met"] == (figures["overhead_pct"] <= 1.0)
