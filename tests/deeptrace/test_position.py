"""Where a rank is, from its heartbeat (deeptrace.rundir.position): one reading, one wording, used by the hang
diagnosis (report.json's typed `hang.ranks`) and by `deeptrace watch` alike."""

from __future__ import annotations

from pathlib import Path

import pytest
from deeptrace.analysis.hang import HangReport, diagnose_hang
from deeptrace.report.markdown import render_markdown
from deeptrace.report.model import Hang, HangRank, Report, ReportError, load_report
from deeptrace.report.terminal import render_terminal
from deeptrace.rundir import CollectiveMark, Heartbeat, PhaseMark, SpanMark, rank_position, read_heartbeats
from deeptrace.watch.status import judge
from rich.console import Console

from tests.deeptrace.fixtures_runs import build_planted_hang
from tests.tui.reports import report_json

STALL_S = 60.0


def _beat(**changes: object) -> Heartbeat:
    fields: dict[str, object] = {
        "rank": 3, "world_size": 4, "host": "h", "pid": 1, "state": "running", "written_wall_s": 1000.0,
        "last_event_wall_s": 990.0, "step": 7, "step_done": 6, "open_span": None, "collective_entered": None,
        "collective_left": None,
    }  # fmt: skip
    fields.update(changes)
    return Heartbeat(**fields)  # type: ignore[arg-type]


def test_inside_a_collective_it_entered_and_has_not_left() -> None:
    entered = CollectiveMark("all_reduce", "dp", 42, wall_s=900.0)
    left = CollectiveMark("all_reduce", "dp", 41, wall_s=899.0)
    span = SpanMark("backward", "compute", 7, since_wall_s=850.0)
    position = rank_position(_beat(collective_entered=entered, collective_left=left, open_span=span))
    assert position.collective == entered and position.since_wall_s == 900.0
    assert position.describe(1080.0) == "step 7, inside all_reduce (group dp, seq 42), for 3.0 min"
    assert position.describe() == "step 7, inside all_reduce (group dp, seq 42)"
    assert position.brief() == "in all_reduce (dp #42)"


def test_a_left_collective_leaves_the_span_then_the_phase() -> None:
    mark = CollectiveMark("all_gather", "tp", 5, wall_s=900.0)
    span = SpanMark("forward", "compute", 7, since_wall_s=950.0)
    position = rank_position(_beat(collective_entered=mark, collective_left=mark, open_span=span))
    assert position.collective is None
    assert position.describe(960.0) == "step 7, inside 'forward' (compute), for 10.0 s"
    assert position.brief() == "in forward"
    in_phase = rank_position(_beat(open_span=span, phase=PhaseMark("checkpoint", since_wall_s=940.0)))
    assert in_phase.brief() == "phase checkpoint"  # the announced phase says more than the span inside it
    assert rank_position(_beat(step=None)).describe(1000.0) == "position unknown"
    assert rank_position(_beat()).brief() is None


def test_hang_diagnosis_and_watch_say_the_same_position(tmp_path: Path) -> None:
    planted = build_planted_hang(tmp_path)
    now = planted.judge_at(STALL_S)
    hang = diagnose_hang(tmp_path, now_wall=now, stall_after_s=STALL_S)
    assert hang is not None
    status = judge(tmp_path, {}, STALL_S, now)
    views = {view.rank: view for view in status.ranks}
    for rank, beat in read_heartbeats(tmp_path, errors={}).items():
        sentence = rank_position(beat).describe(now)
        assert hang.ranks[rank].where() == sentence
        assert views[rank].where == sentence
    assert "inside 'forward' (compute)" in hang.ranks[2].where()
    assert hang.ranks[0].brief() == "in all_reduce (dp #42)"


def test_report_json_hang_ranks_read_back_as_the_typed_model(tmp_path: Path) -> None:
    planted = build_planted_hang(tmp_path)
    hang = diagnose_hang(tmp_path, now_wall=planted.judge_at(STALL_S), stall_after_s=STALL_S)
    assert hang is not None
    read = Hang.model_validate(hang.to_dict() | {"watch": None})
    assert all(isinstance(state, HangRank) for state in read.ranks.values())
    assert [state.rank for state in read.ranks_sorted()] == [0, 1, 2, 3]
    assert read.ranks["2"] == hang.ranks[2]  # the analysis's own type, written and read back unchanged
    assert read.ranks["2"].where() == hang.ranks[2].where()


def test_a_hang_rank_of_the_wrong_shape_is_refused_by_name() -> None:
    report = report_json(hang=True)
    hang = dict(report["hang"])  # type: ignore[call-overload]
    hang["ranks"] = {"0": {"rank": 0, "status": "asleep"}}
    with pytest.raises(ReportError, match=r"report.json: field hang.ranks.0.status"):
        load_report(report | {"hang": hang})


def planted_hang_report(run_dir: Path) -> tuple[HangReport, Report]:
    """The planted hang's diagnosis, and a report.json holding it, as its renderers and xtop read it."""
    planted = build_planted_hang(run_dir)
    hang = diagnose_hang(run_dir, now_wall=planted.judge_at(STALL_S), stall_after_s=STALL_S)
    assert hang is not None
    return hang, load_report(report_json() | {"hang": hang.to_dict()})


def test_terminal_and_markdown_reports_show_where_each_rank_is(tmp_path: Path) -> None:
    hang, report = planted_hang_report(tmp_path)
    console = Console(record=True, width=200)
    render_terminal(report, console)
    rows = [line for line in console.export_text().splitlines() if line.startswith("│") and "step 7, inside" in line]
    assert [row.split("│")[1].strip() for row in rows] == ["2", "0", "1", "3"]  # the culprit first
    assert "culprit" in rows[0] and "inside 'forward' (compute)" in rows[0]
    assert all("waits" in row and "inside all_reduce (group dp, seq 42)" in row for row in rows[1:])
    markdown = render_markdown(report)
    assert f"| 2 | **culprit** | gone | {hang.ranks[2].where()} |" in markdown
    assert f"| 3 | waits | gone | {hang.ranks[3].where()} |" in markdown
