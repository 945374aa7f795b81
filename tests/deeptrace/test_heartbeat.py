"""Heartbeats: where a rank is, rewritten atomically by a thread even while the training thread is blocked."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest
from deeptrace.collect import Collector
from deeptrace.rundir import CollectiveMark, Heartbeat, layout, read_heartbeat, read_heartbeats
from deeptrace.spans import Category

pytestmark = pytest.mark.usefixtures("hot_path")  # each test on the C and the Python contexts


def _beat(run_dir: Path, rank: int = 0) -> Heartbeat:
    return read_heartbeat(layout.heartbeat_path(run_dir, rank))


def _wait_for(condition: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


def test_heartbeat_exists_from_the_start(tmp_path: Path) -> None:
    with Collector(tmp_path, 2, 4, heartbeat_interval_s=None):
        beat = _beat(tmp_path, 2)
        assert (beat.rank, beat.world_size, beat.state, beat.step) == (2, 4, "running", None)
        assert beat.collective_entered is None and beat.in_collective is None


def test_heartbeat_names_the_collective_the_rank_is_inside(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 2, heartbeat_interval_s=None) as collector:
        collector.step_begin(7)
        with collector.collective("all_gather", group="dp"):
            pass
        with collector.collective("all_reduce", group="dp", nbytes=8):
            collector.write_heartbeat()
            inside = _beat(tmp_path)
        collector.write_heartbeat()
        after = _beat(tmp_path)
    assert inside.step == 7 and inside.step_done is None
    entered = inside.collective_entered
    assert entered is not None and (entered.name, entered.group, entered.seq) == ("all_reduce", "dp", 1)
    assert inside.in_collective == entered
    left = inside.collective_left
    assert left is not None and (left.name, left.seq) == ("all_gather", 0)
    assert inside.groups == {"dp": (1, 0)}
    assert inside.open_span is not None and inside.open_span.name == "all_reduce"
    assert inside.open_span.category == "comm" and inside.open_span.step == 7
    assert after.in_collective is None and after.groups == {"dp": (1, 1)}
    assert isinstance(after.collective_left, CollectiveMark) and after.collective_left.seq == 1


def test_group_marks_follow_given_sequence_numbers_and_begun_collectives(tmp_path: Path) -> None:
    """A given seq moves the group's counter; a begun collective is entered (and the latest progress) until it ends."""
    with Collector(tmp_path, 0, 2, heartbeat_interval_s=None) as collector:
        with collector.collective("broadcast", group="pp", seq=5):
            pass
        pending = collector.collective("all_reduce", group="pp").begin()
        with collector.collective("all_gather", group="dp"):
            pass
        collector.write_heartbeat()
        begun = _beat(tmp_path)
        pending.end()
        collector.write_heartbeat()
        ended = _beat(tmp_path)
    assert begun.groups == {"pp": (6, 5), "dp": (0, 0)}
    assert begun.collective_entered is not None and begun.collective_entered.name == "all_gather"
    assert begun.collective_left is not None and begun.collective_left.name == "all_gather"
    assert ended.groups == {"pp": (6, 6), "dp": (0, 0)}
    left = ended.collective_left
    assert left is not None and (left.name, left.group, left.seq) == ("all_reduce", "pp", 6)
    assert ended.last_event_wall_s == pytest.approx(left.wall_s, abs=1e-6)


def test_heartbeat_reports_the_innermost_open_span(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        collector.step_begin(3)
        with collector.span("forward", Category.COMPUTE), collector.span("attention", Category.COMPUTE, layer=2):
            collector.write_heartbeat()
            beat = _beat(tmp_path)
    assert beat.open_span is not None and (beat.open_span.name, beat.open_span.step) == ("attention", 3)


def test_the_end_of_a_span_counts_as_progress_before_and_after_the_flush(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        collector.step_begin(0)
        time.sleep(0.1)
        with collector.span("a", Category.COMPUTE):
            time.sleep(0.1)
        after_span = time.time()
        collector.write_heartbeat()
        buffered = _beat(tmp_path)
        collector.flush(wait=True)
        collector.write_heartbeat()
        flushed = _beat(tmp_path)
    # The span ended just before `after_span`, 0.2 s after the step began: that end is the latest progress.
    assert buffered.last_event_wall_s == pytest.approx(after_span, abs=0.02)
    assert flushed.last_event_wall_s == buffered.last_event_wall_s


def test_thread_keeps_rewriting_while_the_training_thread_is_blocked(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 2, heartbeat_interval_s=0.05) as collector:
        collector.step_begin(1)
        with collector.collective("all_reduce", group="dp"):
            entered = time.time()

            def rewritten_since_blocked() -> bool:
                return _beat(tmp_path).written_wall_s > entered + 0.2

            _wait_for(rewritten_since_blocked)
            blocked = _beat(tmp_path)
    # Progress stopped at the entry; the file kept being rewritten: exactly what tells a hang from a dead process.
    assert blocked.in_collective is not None and blocked.in_collective.name == "all_reduce"
    assert blocked.last_event_wall_s == pytest.approx(blocked.in_collective.wall_s, abs=1e-6)
    assert blocked.written_wall_s - blocked.last_event_wall_s > 0.1


def test_the_thread_survives_a_failed_write(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=0.05) as collector:
        folder = layout.heartbeat_dir(tmp_path)
        shutil.rmtree(folder)  # every write fails now
        with pytest.warns(UserWarning, match="heartbeat not written"):
            time.sleep(0.3)
        folder.mkdir()
        collector.step_begin(5)
        _wait_for(lambda: layout.heartbeat_path(tmp_path, 0).is_file() and _beat(tmp_path).step == 5)


def test_step_end_asks_for_a_rewrite(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=3600) as collector:
        collector.step_begin(0)
        collector.step_end(0)
        _wait_for(lambda: _beat(tmp_path).step_done == 0)


def test_close_and_crash_leave_their_state(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 2, heartbeat_interval_s=0.05):
        pass
    assert _beat(tmp_path, 0).state == "closed"
    with pytest.raises(ZeroDivisionError), Collector(tmp_path, 1, 2, heartbeat_interval_s=0.05):
        _ = 1 / 0
    crashed = _beat(tmp_path, 1)
    assert crashed.state == "crashed" and crashed.error is not None and "ZeroDivisionError" in crashed.error
    assert sorted(read_heartbeats(tmp_path)) == [0, 1]


def test_readers_never_see_a_partial_heartbeat(tmp_path: Path) -> None:
    collector = Collector(tmp_path, 0, 1, heartbeat_interval_s=None)
    stop = threading.Event()

    def hammer() -> None:
        step = 0
        while not stop.is_set():
            collector.step_begin(step)
            collector.write_heartbeat()
            step += 1

    writer = threading.Thread(target=hammer)
    writer.start()
    reads = 0
    try:
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            read_heartbeat(layout.heartbeat_path(tmp_path, 0))  # raises on a partial file
            reads += 1
    finally:
        stop.set()
        writer.join()
        collector.close()
    assert reads > 10
    assert not list(layout.heartbeat_dir(tmp_path).glob(".*tmp"))  # no temporary file left behind


def test_unreadable_heartbeats_are_collected_not_raised_when_asked(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 2, heartbeat_interval_s=None):
        pass
    layout.heartbeat_path(tmp_path, 1).write_text('{"format_version": 1, "rank": 1, "wor')
    errors: dict[int, object] = {}
    beats = read_heartbeats(tmp_path, errors=errors)  # type: ignore[arg-type]
    assert sorted(beats) == [0] and sorted(errors) == [1]
    with pytest.raises(ValueError, match=r"rank-1\.json: invalid JSON"):
        read_heartbeats(tmp_path)
