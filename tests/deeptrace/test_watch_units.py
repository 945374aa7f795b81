"""The pieces of `deeptrace watch` on real files and processes: phases in the heartbeat, the in-process dump,
the trace follower, the slow-rank rule, the verdict's comparison of stacks, and the command's user errors."""

from __future__ import annotations

import faulthandler
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from deeptrace.analysis.hang import HangReport
from deeptrace.collect import Collector
from deeptrace.report.model import HangCollective
from deeptrace.rundir import layout, read_heartbeat
from deeptrace.spans import Category
from deeptrace.watch.follow import TraceFollower
from deeptrace.watch.stacks import Frame, StackSnapshot, ThreadStack, capture_signal, parse_faulthandler
from deeptrace.watch.status import SlowConfig, find_slow
from deeptrace.watch.verdict import RankStacks, decide

DEEPTRACE = str(Path(sys.executable).with_name("deeptrace"))


def test_a_phase_is_announced_in_the_heartbeat_and_recorded_as_a_span(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        with collector.phase("checkpoint"):
            collector.write_heartbeat()
            inside = read_heartbeat(layout.heartbeat_path(tmp_path, 0))
        collector.write_heartbeat()
        after = read_heartbeat(layout.heartbeat_path(tmp_path, 0))
    assert inside.phase is not None and inside.phase.name == "checkpoint"
    assert inside.open_span is not None and inside.open_span.category == "checkpoint"
    assert after.phase is None
    assert inside.thread_id is not None and inside.stack_signal == int(signal.SIGUSR2)


def test_faulthandler_text_is_parsed_innermost_first(tmp_path: Path) -> None:
    out = tmp_path / "dump.txt"
    with out.open("w") as handle:

        def inner() -> None:
            faulthandler.dump_traceback(handle, all_threads=True)

        inner()
    threads = parse_faulthandler(out.read_text())
    mine = next(t for t in threads if t.thread_id is not None and t.thread_id == __import__("threading").get_ident())
    assert mine.frames[0].function == "inner"
    assert mine.frames[0].file == __file__
    assert mine.frames[1].function == "test_faulthandler_text_is_parsed_innermost_first"


@pytest.mark.slow
def test_the_collector_dumps_its_stacks_on_its_signal(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import time
        from deeptrace.collect import Collector
        with Collector({str(tmp_path)!r}, 0, 1, heartbeat_interval_s=0.1):
            def blocked_here():
                time.sleep(60)
            blocked_here()
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 60
        while not layout.heartbeat_path(tmp_path, 0).exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)
        beat = read_heartbeat(layout.heartbeat_path(tmp_path, 0))
        snapshot = capture_signal(tmp_path, 0, beat.pid, beat.stack_signal)
        training = snapshot.thread(beat.thread_id)
        assert training is not None
        assert training.frames[0].function == "blocked_here"
        assert any(t.thread_id != beat.thread_id for t in snapshot.threads)  # the heartbeat thread too
    finally:
        proc.kill()
        proc.wait()


def test_the_follower_reads_only_what_was_appended(tmp_path: Path) -> None:
    follower = TraceFollower(tmp_path)
    collector = Collector(tmp_path, 0, 1, heartbeat_interval_s=None)
    for step in range(3):
        collector.step_begin(step)
        with collector.collective("all_reduce", group="world"):
            pass
        collector.step_end(step)
    collector.flush(wait=True)
    first = follower.poll()[0]
    assert [a.seq for a in first.arrivals] == [0, 1, 2]
    assert [s.step for s in first.steps] == [0, 1, 2]
    collector.step_begin(3)
    with collector.collective("all_reduce", group="world"):
        pass
    collector.step_end(3)
    collector.close()
    assert [a.seq for a in follower.poll()[0].arrivals] == [0, 1, 2, 3]


def _run_with_late_rank(run_dir: Path, late_rank: int | None, world: int = 3, steps: int = 12) -> None:
    # Three collectors in one process, with real clocks: the late rank enters each collective 20 ms after the rest.
    collectors = [Collector(run_dir, r, world, heartbeat_interval_s=None) for r in range(world)]
    for step in range(steps):
        for r, c in enumerate(collectors):
            c.step_begin(step)
            if r == late_rank:
                time.sleep(0.02)
            c.collective("all_reduce", group="world").__enter__().__exit__(None, None, None)
            c.step_end(step)
    for c in collectors:
        c.close()


def test_a_rank_that_arrives_last_by_far_is_slow_and_jitter_is_not(tmp_path: Path) -> None:
    _run_with_late_rank(tmp_path / "late", late_rank=2)
    slow = find_slow(TraceFollower(tmp_path / "late").poll(), SlowConfig())
    assert list(slow) == [2]
    assert slow[2].lateness_ms >= 15
    assert "arrived last at 12 of the last 12 collectives" in slow[2].evidence
    _run_with_late_rank(tmp_path / "even", late_rank=None)
    assert find_slow(TraceFollower(tmp_path / "even").poll(), SlowConfig()) == {}


def _stacks(rank: int, where: list[Frame]) -> RankStacks:
    snaps = [StackSnapshot(rank, t, "py-spy", [ThreadStack(1, "MainThread", where)]) for t in (0.0, 1.0, 2.0)]
    return RankStacks(rank, snaps, 1)


def test_the_verdict_names_the_rank_alone_in_another_place_when_the_heartbeats_cannot() -> None:
    lib = Frame("wait", "/x/site-packages/torch/distributed/distributed_c10d.py", 3000)
    allreduce = Frame("train", "/job/train.py", 40)
    hang = HangReport(
        now_wall_s=0.0, stall_after_s=3.0, world_size=4, stopped_ranks=[0, 1, 2, 3], waiting_ranks=[0, 1, 2, 3],
        culprit_ranks=[], collective=HangCollective(group="world", seq=7, name="all_reduce"),
        reason="every rank entered", ranks={}, evidence=[],
    )  # fmt: skip
    stacks = {r: _stacks(r, [lib, allreduce]) for r in (0, 1, 3)}
    stacks[2] = _stacks(2, [Frame("sleep", "<native>", 0, native=True), Frame("load", "/job/data.py", 12)])
    verdict = decide(hang, stacks, 3.0)
    assert verdict.culprit_ranks == [2]
    assert verdict.odd_ranks == [2]
    culprit = verdict.culprits[0]
    assert culprit.frame == Frame("load", "/job/data.py", 12)
    assert "stacks: unchanged over 3 snapshots (2.0 s)" in culprit.evidence
    assert verdict.wait_points == {"train (/job/train.py:40)": [0, 1, 3], "load (/job/data.py:12)": [2]}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["watch", "/nonexistent/run"], "no such directory"),
        (["watch", "{tmp}", "--webhook", "ftp://x"], "not an http:// or https:// URL"),
        (["watch", "{tmp}", "--once"], "no heartbeat yet"),
        (["watch", "{tmp}", "--threshold", "0"], "Invalid value for '--threshold'"),
    ],
)
def test_watch_user_errors_are_one_message_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    done = subprocess.run(
        [DEEPTRACE, *(a.replace("{tmp}", str(tmp_path)) for a in args)], capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr.decode()
    assert b"Traceback" not in done.stderr


@pytest.mark.slow
def test_a_healthy_run_once_exits_0_and_a_hung_one_4(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=0.1) as collector:
        collector.step_begin(0)
        done = subprocess.run([DEEPTRACE, "watch", str(tmp_path), "--once", "--threshold", "30"],
                              capture_output=True, timeout=60, check=False)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        with collector.span("forward", Category.COMPUTE):
            time.sleep(1.2)
            done = subprocess.run([DEEPTRACE, "watch", str(tmp_path), "--once", "--threshold", "1",
                                   "--snapshots", "1"], capture_output=True, timeout=60, check=False)  # fmt: skip
        assert done.returncode == 4, done.stdout + done.stderr
        assert layout.hang_dirs(tmp_path)


@pytest.mark.slow
def test_a_run_killed_while_progressing_is_finished_not_hung(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import time
        from deeptrace.collect import Collector
        collector = Collector({str(tmp_path)!r}, 0, 1, heartbeat_interval_s=0.1)
        step = 0
        while True:
            collector.step_begin(step)
            time.sleep(0.02)
            collector.step_end(step)
            step += 1
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 60
    while not layout.heartbeat_path(tmp_path, 0).exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)
    proc.kill()  # a time limit: SIGKILL while it progresses
    proc.wait()
    time.sleep(1.2)
    done = subprocess.run([DEEPTRACE, "watch", str(tmp_path), "--once", "--threshold", "1"], capture_output=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert b"finished: every rank closed or gone" in done.stdout
    assert not layout.hang_dirs(tmp_path)


def test_ranks_that_waited_for_a_late_arrival_are_not_stuck_until_the_last_one_has_waited_too(tmp_path: Path) -> None:
    # Rank 1 has waited in the all-reduce longer than the threshold (for rank 0, busy in a checkpoint); rank 0 has
    # just entered it. The collective is about to complete: no hang. Without rank 0's arrival it would be one.
    from deeptrace.watch.status import judge

    early = Collector(tmp_path, 1, 2, heartbeat_interval_s=0.1)
    late = Collector(tmp_path, 0, 2, heartbeat_interval_s=0.1)
    try:
        for collector in (early, late):
            collector.step_begin(3)
        waiting = early.collective("all_reduce").begin()
        early.write_heartbeat()
        late.write_heartbeat()
        time.sleep(1.5)
        late.write_heartbeat()
        alone = judge(tmp_path, {}, threshold_s=1.0, now=time.time())
        assert alone.overall == "hung", alone  # rank 1 waits for a rank that never came: a real hang

        arriving = late.collective("all_reduce").begin()
        late.write_heartbeat()
        early.write_heartbeat()
        status = judge(tmp_path, {}, threshold_s=1.0, now=time.time())
        assert status.overall != "hung", status
        assert {view.rank: view.state for view in status.ranks}[1] == "waiting"
        arriving.end()
        waiting.end()
    finally:
        early.close()
        late.close()


def test_a_rank_whose_heartbeat_still_shows_a_collective_the_others_have_left_is_not_stuck(tmp_path: Path) -> None:
    # Rank 1's heartbeat was last written inside the all-reduce (its writer thread has not run since); rank 0
    # progresses. Before rank 0 has reached that all-reduce, rank 1 really waits for it: a hang. Once rank 0 has
    # left it, the collective completed, so rank 1 cannot still be inside: its heartbeat is behind, not the rank.
    from deeptrace.watch.status import judge

    behind = Collector(tmp_path, 1, 2, heartbeat_interval_s=None, trace=False)
    ahead = Collector(tmp_path, 0, 2, heartbeat_interval_s=None, trace=False)
    try:
        for collector in (behind, ahead):
            collector.step_begin(3)
        inside = behind.collective("all_reduce").begin()
        time.sleep(1.5)
        behind.write_heartbeat()  # its last write: inside the all-reduce for 1.5 s, longer than the threshold
        ahead.step_end(3)
        ahead.step_begin(4)
        ahead.write_heartbeat()
        before = judge(tmp_path, {}, threshold_s=1.0, now=time.time())
        assert before.overall == "hung", before

        with ahead.collective("all_reduce"):
            pass
        ahead.step_end(4)
        ahead.step_begin(5)
        ahead.write_heartbeat()
        after = judge(tmp_path, {}, threshold_s=1.0, now=time.time())
        assert after.overall != "hung", after
        view = {view.rank: view for view in after.ranks}[1]
        assert view.state == "progressing" and "heartbeat behind" in view.note, view
        inside.end()
    finally:
        behind.close()
        ahead.close()
