"""Hang diagnosis on synthetic run directories with known answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deeptrace.analysis.hang import diagnose_hang
from deeptrace.collect import Collector
from deeptrace.report.model import HangCollective
from deeptrace.rundir import RunWriter, layout
from deeptrace.spans import Category

from tests.deeptrace.fixtures_runs import age_heartbeats, build_clean_run, build_planted_hang

STALL_S = 60.0


def test_planted_hang_names_the_rank_the_others_wait_for(tmp_path: Path) -> None:
    planted = build_planted_hang(tmp_path)
    report = diagnose_hang(tmp_path, now_wall=planted.judge_at(STALL_S), stall_after_s=STALL_S)
    assert report is not None
    assert report.culprit_ranks == [2]
    assert report.waiting_ranks == [0, 1, 3]
    assert report.collective == HangCollective(group="dp", seq=42, name="all_reduce")
    assert report.stopped_ranks == [0, 1, 2, 3]
    stuck = report.ranks[2]
    assert stuck.step == 7 and stuck.open_span == "'forward' (compute)" and stuck.last_seq["dp"] == 41
    assert stuck.in_collective is None
    for rank in (0, 1, 3):
        assert report.ranks[rank].in_collective == HangCollective(group="dp", seq=42, name="all_reduce")
        assert report.ranks[rank].step == 7
    summary = report.summary()
    assert "ranks 0, 1, 3 wait in all_reduce (group dp, seq 42) at step 7 for rank 2" in summary
    assert "'forward' (compute)" in summary
    assert any("rank 2:" in line and "last entered seq in group dp: 41" in line for line in report.evidence)


def test_report_dict_is_json_for_report_json(tmp_path: Path) -> None:
    planted = build_planted_hang(tmp_path)
    report = diagnose_hang(tmp_path, now_wall=planted.judge_at(STALL_S), stall_after_s=STALL_S)
    assert report is not None
    as_json = json.loads(json.dumps(report.to_dict()))
    assert as_json["culprit_ranks"] == [2] and as_json["waiting_ranks"] == [0, 1, 3]
    assert as_json["collective"] == {"group": "dp", "seq": 42, "name": "all_reduce"}
    assert as_json["ranks"]["0"]["in_collective"]["seq"] == 42
    assert as_json["summary"] == report.summary()


def test_clean_run_has_no_hang(tmp_path: Path) -> None:
    build_clean_run(tmp_path)
    assert diagnose_hang(tmp_path, now_wall=1e12, stall_after_s=STALL_S) is None


def test_no_heartbeats_means_nothing_to_diagnose(tmp_path: Path) -> None:
    assert diagnose_hang(tmp_path) is None


def test_ranks_still_within_the_stall_threshold_are_no_hang(tmp_path: Path) -> None:
    planted = build_planted_hang(tmp_path, stuck_for_s=30)
    assert diagnose_hang(tmp_path, now_wall=planted.finished_wall_s, stall_after_s=STALL_S) is None


def test_live_hang_shows_stalled_ranks_that_are_still_alive(tmp_path: Path) -> None:
    planted = build_planted_hang(tmp_path)
    report = diagnose_hang(tmp_path, now_wall=planted.finished_wall_s + 1, stall_after_s=STALL_S)
    assert report is not None
    assert {s.status for s in report.ranks.values()} == {"stalled"}
    assert report.culprit_ranks == [2]


def test_ranks_killed_while_progressing_are_no_hang(tmp_path: Path) -> None:
    """A time limit kills every rank mid-step: positions differ, but nobody was seen stuck."""
    planted = build_planted_hang(tmp_path, stuck_for_s=0)
    assert diagnose_hang(tmp_path, now_wall=planted.judge_at(STALL_S), stall_after_s=STALL_S) is None


def test_hung_then_killed_ranks_are_still_a_hang(tmp_path: Path) -> None:
    planted = build_planted_hang(tmp_path)
    report = diagnose_hang(tmp_path, now_wall=planted.judge_at(STALL_S), stall_after_s=STALL_S)
    assert report is not None
    assert {s.status for s in report.ranks.values()} == {"gone"}
    assert all(s.stalled for s in report.ranks.values())
    assert "no progress for 10.0 min before that" in (report.ranks[0].note or "")


def test_missing_heartbeat_of_the_culprit_is_reported_and_suspected(tmp_path: Path) -> None:
    planted = build_planted_hang(tmp_path)
    layout.heartbeat_path(tmp_path, 2).unlink()
    report = diagnose_hang(tmp_path, now_wall=planted.judge_at(STALL_S), stall_after_s=STALL_S)
    assert report is not None
    assert report.missing_ranks == [2] and report.ranks[2].status == "missing"
    assert report.culprit_ranks == [2] and "missing" in report.reason


def test_half_written_heartbeat_is_reported_not_raised(tmp_path: Path) -> None:
    planted = build_planted_hang(tmp_path)
    path = layout.heartbeat_path(tmp_path, 1)
    path.write_bytes(path.read_bytes()[:40])
    report = diagnose_hang(tmp_path, now_wall=planted.judge_at(STALL_S), stall_after_s=STALL_S)
    assert report is not None
    assert list(report.unreadable_ranks) == [1] and "invalid JSON" in report.unreadable_ranks[1]
    assert report.culprit_ranks == [2] and report.waiting_ranks == [0, 3]


def test_world_size_from_meta_finds_a_rank_that_never_wrote(tmp_path: Path) -> None:
    RunWriter(tmp_path, 0, 3).write_meta()
    for rank in (0, 1):
        collector = Collector(tmp_path, rank, 2, heartbeat_interval_s=None)  # heartbeats say 2: meta says 3
        collector.step_begin(0)
        with collector.collective("barrier", group="world"):
            collector.close(final_state="running")
    age_heartbeats(tmp_path, 600)
    report = diagnose_hang(tmp_path, now_wall=1e12, stall_after_s=STALL_S)
    assert report is not None
    assert report.world_size == 3 and report.missing_ranks == [2]
    assert report.culprit_ranks == [2] and report.waiting_ranks == [0, 1]


def test_rank_behind_in_steps_is_the_culprit_when_nobody_is_in_a_collective(tmp_path: Path) -> None:
    for rank in range(3):
        collector = Collector(tmp_path, rank, 3, heartbeat_interval_s=None)
        step = 4 if rank == 1 else 5
        collector.step_begin(step)
        with collector.span("data", Category.DATA):
            collector.close(final_state="running")
    age_heartbeats(tmp_path, 600)
    report = diagnose_hang(tmp_path, now_wall=1e12, stall_after_s=STALL_S)
    assert report is not None
    assert report.collective is None
    assert report.culprit_ranks == [1] and report.waiting_ranks == [0, 2]
    assert "step (4) is behind" in report.reason


def test_crashed_rank_is_the_one_the_waiting_ranks_wait_for(tmp_path: Path) -> None:
    for rank in range(2):
        collector = Collector(tmp_path, rank, 2, heartbeat_interval_s=None)
        collector.step_begin(0)
        if rank == 0:
            with collector.collective("all_reduce", group="dp"):
                collector.close(final_state="running")
        else:
            collector.close(final_state="crashed", error="RuntimeError: CUDA out of memory")
    report = diagnose_hang(tmp_path, now_wall=1e12, stall_after_s=STALL_S)
    assert report is not None
    assert report.culprit_ranks == [1] and report.waiting_ranks == [0]
    assert report.ranks[1].status == "crashed"
    assert any("CUDA out of memory" in line for line in report.evidence)


def test_progressing_rank_that_never_arrives_is_the_culprit(tmp_path: Path) -> None:
    """A rank busy elsewhere (still making progress) while the others wait for it."""
    build_planted_hang(tmp_path)
    busy = Collector(tmp_path, 2, 4, heartbeat_interval_s=None)  # rank 2 comes back and keeps working
    busy.step_begin(7)
    busy.close(final_state="running")
    report = diagnose_hang(tmp_path, stall_after_s=STALL_S)
    assert report is not None
    assert report.ranks[2].status == "progressing"
    assert report.culprit_ranks == [2] and report.waiting_ranks == [0, 1, 3]


@pytest.mark.parametrize("stall", [0.0, 1e9])
def test_thresholds_at_the_edges(tmp_path: Path, stall: float) -> None:
    planted = build_planted_hang(tmp_path)
    report = diagnose_hang(tmp_path, now_wall=planted.finished_wall_s + 1, stall_after_s=stall)
    assert (report is None) == (stall > 1)
