"""Collective matching, clock offsets and the straggler verdict, on planted slow ranks and planted clock skew."""

from pathlib import Path

import pytest
from deeptrace.analysis.run import analyse_run
from deeptrace.report.schema import build_report

from tests.deeptrace.kineto_builders import allreduce_ranks, collector_run, write_ranks

MS = 1_000_000


def test_planted_slow_rank_is_the_culprit_and_others_wait(tmp_path: Path) -> None:
    write_ranks(allreduce_ranks(4, steps=3, per_step=4, slow_rank=2, late_us=5000), tmp_path)
    a = analyse_run(tmp_path, jobs=2)
    assert a.matched_by == {"seq": 12, "order": 0}
    verdict = a.stragglers
    assert verdict["verdict"] == "straggler"
    (culprit,) = verdict["culprits"]
    assert culprit["rank"] == 2
    assert culprit["arrived_last"] == 12 and culprit["last_arrival_share"] == 1.0
    assert culprit["mean_lateness_ms"] == pytest.approx(5.0)
    assert culprit["caused_wait_ms"] == pytest.approx(12 * 3 * 5.0)  # 12 collectives × 3 waiting ranks × 5 ms
    assert (culprit["steps_recurring"], culprit["steps_total"]) == (3, 3)
    assert sorted(w["rank"] for w in verdict["waiting_ranks"]) == [0, 1, 3]
    assert all(w["waited_ms"] == pytest.approx(12 * 5.0) for w in verdict["waiting_ranks"])
    assert all(o == 0 for o in a.offsets_ns.values())
    per_collective = build_report(a).to_json()["collectives"]["per_collective"]
    assert len(per_collective) == 12
    assert all(c["last_rank"] == 2 and c["skew_ms"] == pytest.approx(5.0) for c in per_collective)
    assert [c["seq"] for c in per_collective] == list(range(12))


def test_no_straggler_when_ranks_arrive_together(tmp_path: Path) -> None:
    write_ranks(allreduce_ranks(3, steps=2, per_step=3), tmp_path)
    assert analyse_run(tmp_path, jobs=1).stragglers["verdict"] == "none"


def test_clock_skew_is_estimated_and_removed_before_skew(tmp_path: Path) -> None:
    # Rank 3's host clock is 250 ms ahead, rank 1's 40 ms behind; rank 2 is the real straggler.
    traces = allreduce_ranks(4, steps=3, per_step=4, slow_rank=2, late_us=3000, clock_skew_us={3: 250_000, 1: -40_000})
    write_ranks(traces, tmp_path)
    a = analyse_run(tmp_path, jobs=2)
    assert a.offsets_ns[0] == 0
    assert a.offsets_ns[1] == pytest.approx(-40 * MS, abs=1000)
    assert a.offsets_ns[3] == pytest.approx(250 * MS, abs=1000)
    assert [c["rank"] for c in a.stragglers["culprits"]] == [2]
    assert max(a.skew.skew_ns) == pytest.approx(3 * MS, abs=1000)
    # Without the correction, the rank whose clock is ahead looks like a 250 ms straggler.
    uncorrected = analyse_run(tmp_path, jobs=1, clock_sync=False)
    assert [c["rank"] for c in uncorrected.stragglers["culprits"]] == [3]


def test_matching_by_order_without_sequence_numbers(tmp_path: Path) -> None:
    write_ranks(allreduce_ranks(2, steps=2, per_step=3, slow_rank=1, late_us=2000, with_seq=False), tmp_path)
    a = analyse_run(tmp_path, jobs=1)
    assert a.matched_by == {"seq": 0, "order": 6}
    assert [c["rank"] for c in a.stragglers["culprits"]] == [1]


def test_collector_run_directory_with_planted_slow_rank_and_skew(tmp_path: Path) -> None:
    run = collector_run(tmp_path / "run", 4, steps=3, slow_rank=1, late_ms=5.0, clock_skew_ms={2: 120.0})
    a = analyse_run(run, jobs=2)
    assert set(a.ranks) == {0, 1, 2, 3}
    assert all(r.source == "collector" for r in a.ranks.values())
    assert a.offsets_ns[2] == pytest.approx(120 * MS, abs=1000)
    assert a.matched_by["seq"] == 3
    (culprit,) = a.stragglers["culprits"]
    assert culprit["rank"] == 1 and culprit["mean_lateness_ms"] == pytest.approx(5.0, abs=0.01)
    # breakdown from collector spans: per step 10 ms compute (15 on the slow rank), comm the rest of the window
    steps = a.ranks[0].breakdown.steps
    assert [s.step for s in steps] == [0, 1, 2]
    assert steps[0].compute_ms == pytest.approx(10.0)
    assert steps[0].exposed_comm_ms == pytest.approx(7.0)
    assert a.ranks[0].breakdown.overall.overlap_pct == pytest.approx(0.0)
