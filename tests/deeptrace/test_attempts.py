"""A rank restarted after a kill: `deeptrace analyze` reads its current attempt and lists the earlier ones."""

from __future__ import annotations

import time
from pathlib import Path

from deeptrace.analysis.run import analyse_run
from deeptrace.collect import Collector
from deeptrace.report.markdown import render_markdown
from deeptrace.report.model import load_report
from deeptrace.report.schema import build_report
from deeptrace.rundir import layout
from deeptrace.spans import Category


def _attempt(run_dir: Path, rank: int, compute_s: float, steps: int = 3) -> None:
    with Collector(run_dir, rank, 2, heartbeat_interval_s=None) as collector:
        for step in range(steps):
            collector.step_begin(step)
            with collector.span("forward", Category.COMPUTE):
                time.sleep(compute_s)
            with collector.collective("all_reduce", group="world"):
                pass
            collector.step_end(step)


def test_a_resumed_run_is_analysed_on_its_current_attempt(tmp_path: Path) -> None:
    # Rank 0's first attempt computed 60 ms per step and was killed; the resumed run computes 5 ms per step.
    _attempt(tmp_path, 0, 0.06)
    _attempt(tmp_path, 0, 0.005)
    _attempt(tmp_path, 1, 0.005)
    assert layout.earlier_attempts(tmp_path) == {0: {1: layout.attempt_trace_path(tmp_path, 0, 1)}}

    report = build_report(analyse_run(tmp_path, jobs=1))
    rank0 = report.ranks["0"]
    assert rank0.path == str(layout.trace_path(tmp_path, 0))
    assert rank0.breakdown.compute_ms < 3 * 20  # three steps of 5 ms, not of 60 ms
    assert [(e.rank, e.attempt) for e in report.earlier_attempts] == [(0, 1)]
    assert not any("second collector trace" in w for w in report.warnings)
    assert "rank 0, attempt 1" in render_markdown(report)
    # report.json round-trips through the one model its readers use.
    assert load_report(report.to_json()) == report
