"""xtop shows where each rank is as deeptrace reads it: the run screen from the heartbeats (rundir.position), the
trace screen from report.json's typed `hang.ranks`."""

from __future__ import annotations

from pathlib import Path

from deeptrace.rundir import rank_position, read_heartbeats
from rich.console import Console
from xtop.run_source import RunSource
from xtop.screens.trace import render_report

from tests.deeptrace.fixtures_runs import build_planted_hang
from tests.deeptrace.test_position import planted_hang_report

STALL_S = 60.0


def test_run_screen_position_is_deeptraces(tmp_path: Path) -> None:
    planted = build_planted_hang(tmp_path)
    snapshot = RunSource(tmp_path).poll(now_wall_s=planted.judge_at(STALL_S))
    beats = read_heartbeats(tmp_path, errors={})
    assert {status.rank: status.where for status in snapshot.ranks} == {
        rank: rank_position(beat).brief() for rank, beat in beats.items()
    }
    assert snapshot.ranks[0].where == "in all_reduce (dp #42)"
    assert snapshot.ranks[2].where == "in forward"


def test_trace_screen_reads_the_hang_ranks_by_type(tmp_path: Path) -> None:
    _, report = planted_hang_report(tmp_path)
    console = Console(record=True, width=160)
    console.print(render_report(report))
    lines = console.export_text().splitlines()
    rows = {line.split()[0]: line for line in lines if line.split()[:2] in (["0", "gone"], ["2", "gone"])}
    assert "in all_reduce (dp #42)" in rows["0"]
    assert "in 'forward' (compute)" in rows["2"]
