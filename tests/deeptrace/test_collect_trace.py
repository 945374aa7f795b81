"""The collector's trace files: what is recorded reads back exactly; torn, garbled and foreign files are explained."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import pytest
from deeptrace.collect import STEP_SPAN_NAME, STEP_TRACK, Collector, read_trace, trace_paths
from deeptrace.collect import trace_format as fmt
from deeptrace.errors import TraceInputError
from deeptrace.rundir import layout, read_heartbeats, read_rank_clock
from deeptrace.spans import Category, Span
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.usefixtures("hot_path")  # each test on the C and the Python contexts


def _spans(run_dir: Path, rank: int = 0) -> list[Span]:
    return list(read_trace(layout.trace_path(run_dir, rank)))


def _wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_spans_collectives_and_records_read_back_with_every_field(tmp_path: Path) -> None:
    with Collector(tmp_path, 1, 2, heartbeat_interval_s=None) as collector:
        collector.step_begin(3)
        with (
            collector.span("forward", Category.COMPUTE, layer=5, nbytes=7),
            collector.collective("all_gather", group="dp", nbytes=1024),
        ):
            pass
        collector.record("kernel", Category.MEMORY, 100, 250, step=9, track="cuda:0/7", group="tp", seq=4)
        collector.step_end(3)
    reader = read_trace(layout.trace_path(tmp_path, 1))
    assert (reader.rank, reader.world_size) == (1, 2)
    spans = list(reader)
    by_name = {s.name: s for s in spans}
    gather, forward, kernel, step = by_name["all_gather"], by_name["forward"], by_name["kernel"], by_name["step"]
    assert gather == Span("all_gather", Category.COMM, gather.start_ns, gather.end_ns, "main/1", 3, None, 1024, "dp", 0)
    assert forward == Span("forward", Category.COMPUTE, forward.start_ns, forward.end_ns, "main", 3, 5, 7, None, None)
    assert kernel == Span("kernel", Category.MEMORY, 100, 250, "cuda:0/7", 9, None, None, "tp", 4)
    assert step.name == STEP_SPAN_NAME and step.track == STEP_TRACK and step.category == Category.OTHER
    # The nested collective lies inside its parent, and the step window holds them both.
    assert forward.start_ns <= gather.start_ns <= gather.end_ns <= forward.end_ns
    assert step.start_ns <= forward.start_ns and forward.end_ns <= step.end_ns
    assert reader.torn_bytes == 0 and reader.spans_read == 4


def test_sequence_numbers_count_per_group_and_explicit_ones_are_kept(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        for group in ("dp", "ep", "dp", "dp", "ep"):
            with collector.collective("c", group=group):
                pass
        with collector.collective("c", group="dp", seq=100):
            pass
        with collector.collective("c", group="dp"):
            pass
    got = [(s.group, s.seq) for s in _spans(tmp_path)]
    assert got == [("dp", 0), ("ep", 0), ("dp", 1), ("dp", 2), ("ep", 1), ("dp", 100), ("dp", 101)]


def test_sequence_numbers_stay_per_group_with_more_groups_than_are_cached_and_names_made_at_run_time(
    tmp_path: Path,
) -> None:
    """The C hub remembers the last few groups by object identity: more groups than it keeps, and equal group names
    that are different objects (built at run time), must still count on one counter per group name."""
    groups = [f"g{index}" for index in range(7)]
    expected: list[tuple[str, int]] = []
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        for round_index in range(3):
            for index, group in enumerate(groups):
                name = group if (index + round_index) % 2 else "".join(["g", str(index)])  # a new, equal str
                with collector.collective("all_reduce", group=name):
                    pass
                expected.append((group, round_index))
    assert [(s.group, s.seq) for s in _spans(tmp_path)] == expected


def test_step_end_makes_the_step_readable_while_the_collector_runs(tmp_path: Path) -> None:
    collector = Collector(tmp_path, 0, 1, heartbeat_interval_s=None)
    collector.step_begin(0)
    with collector.span("a", Category.COMPUTE):
        pass
    time.sleep(0.05)
    assert _spans(tmp_path) == []  # buffered
    collector.step_end(0)  # hands the step to the writer thread, which appends it at once
    _wait_until(lambda: [s.name for s in _spans(tmp_path)] == ["a", "step"])
    collector.close()


def test_a_full_buffer_is_written_without_a_step_end(tmp_path: Path) -> None:
    collector = Collector(tmp_path, 0, 1, heartbeat_interval_s=None, buffer_spans=3)
    for index in range(5):
        collector.record(f"s{index}", Category.DATA, index, index + 1)
    _wait_until(lambda: len(_spans(tmp_path)) == 3)
    time.sleep(0.05)
    assert [s.name for s in _spans(tmp_path)] == ["s0", "s1", "s2"]  # the other two wait in the buffer
    collector.flush(wait=True)
    assert len(_spans(tmp_path)) == 5
    collector.close()
    assert len(_spans(tmp_path)) == 5


def test_spans_of_other_threads_go_on_their_own_track(tmp_path: Path) -> None:
    collector = Collector(tmp_path, 0, 1, heartbeat_interval_s=None)

    def load() -> None:
        with collector.span("load", Category.DATA), collector.span("decode", Category.DATA):
            pass

    worker = threading.Thread(target=load, name="loader")
    worker.start()
    worker.join()
    collector.close()
    assert {(s.name, s.track) for s in _spans(tmp_path)} == {("decode", "loader/1"), ("load", "loader")}


def test_main_track_belongs_to_the_creating_thread_only_while_it_lives(tmp_path: Path) -> None:
    """The hot path knows the creating thread by its ident; a later thread may get that ident once it has ended."""
    made: list[Collector] = []

    def make() -> None:
        made.append(Collector(tmp_path, 0, 1, heartbeat_interval_s=None))
        with made[0].span("setup", Category.OTHER):
            pass

    def later(name: str) -> None:
        with made[0].span(name, Category.COMPUTE):
            pass

    creator = threading.Thread(target=make, name="creator")
    creator.start()
    creator.join()
    for name in ("w1", "w2"):  # idents of ended threads are commonly reused at once
        worker = threading.Thread(target=later, args=(name,), name=name)
        worker.start()
        worker.join()
    made[0].close()
    assert [(s.name, s.track) for s in _spans(tmp_path)] == [("setup", "main"), ("w1", "w1"), ("w2", "w2")]


def test_threads_recording_while_buffers_flush_lose_nothing(tmp_path: Path) -> None:
    """Several threads record at once, and the small buffer is flushed from whichever thread fills it."""
    collector = Collector(tmp_path, 0, 1, heartbeat_interval_s=None, buffer_spans=7)
    per_thread = 2000

    def work() -> None:
        for index in range(per_thread):
            with collector.span("w", Category.COMPUTE, layer=index % 3):
                pass

    workers = [threading.Thread(target=work, name=f"worker{n}") for n in range(4)]
    for worker in workers:
        worker.start()
    work()  # the main thread too
    for worker in workers:
        worker.join()
    collector.close()
    spans = _spans(tmp_path)
    counts: dict[str, int] = {}
    for span in spans:
        counts[span.track] = counts.get(span.track, 0) + 1
    assert counts == {f"worker{n}": per_thread for n in range(4)} | {"main": per_thread}
    for track in counts:  # one thread's spans are in order and never overlap
        mine = [s for s in spans if s.track == track]
        assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(mine))


def test_begin_and_end_where_a_with_block_does_not_fit(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        first = collector.collective("all_gather", group="dp").begin()  # issued here ...
        with collector.span("forward", Category.COMPUTE):
            second = collector.collective("all_gather", group="dp").begin()
            collector.write_heartbeat()
            waiting = read_heartbeats(tmp_path)[0]
        first.end()  # ... waited for here, out of order
        with collector.span("backward", Category.COMPUTE):
            third = collector.collective("reduce_scatter", group="dp").begin()
        second.end()
        third.end()
    assert waiting.in_collective is not None and waiting.in_collective.seq == 1
    assert waiting.open_span is not None and waiting.open_span.name == "forward"  # begun ones are not nested
    spans = {(s.name, s.seq): s for s in _spans(tmp_path)}
    assert spans[("forward", None)].track == "main" and spans[("backward", None)].track == "main"
    # In flight together: separate lanes; a lane freed by end() is taken again.
    assert spans[("all_gather", 0)].track == "main/async-0"
    assert spans[("all_gather", 1)].track == "main/async-1"
    assert spans[("reduce_scatter", 2)].track == "main/async-0"
    by_track: dict[str, list[Span]] = {}
    for span in spans.values():
        by_track.setdefault(span.track, []).append(span)
    for same in by_track.values():  # never two overlapping spans on one track
        same.sort(key=lambda s: s.start_ns)
        assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(same))


class _NoticedName(str):
    """A span name that notes which thread frees it (it dies with the last span that holds it)."""

    freed_on: ClassVar[list[int]] = []

    def __del__(self) -> None:
        self.freed_on.append(threading.get_ident())


def test_written_spans_are_freed_by_the_thread_that_recorded_them(tmp_path: Path) -> None:
    """The writer thread packs a batch and hands it back: freeing it there would write, from another core, to the
    objects the training thread's next spans use (names, categories, the allocator's free lists)."""
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        for step in range(4):
            _NoticedName.freed_on.clear()
            collector.step_begin(step)
            # Equal names, new objects each step: the string table keeps the first step's, later ones die with
            # their spans.
            with collector.span(_NoticedName("forward"), Category.COMPUTE):
                pass
            with collector.collective(_NoticedName("all_gather"), group="dp"):
                pass
            collector.step_end(step)
            collector.flush(wait=True)  # written, and still alive until this thread's next flush
            assert _NoticedName.freed_on == ([] if step < 2 else [threading.get_ident()] * 2)
    assert [span.name for span in _spans(tmp_path) if span.track != STEP_TRACK] == ["forward", "all_gather"] * 4


def test_a_span_context_records_one_span_only(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        for context in (collector.span("x", Category.COMPUTE), collector.collective("c", group="dp")):
            with context:
                pass
            with pytest.raises(RuntimeError, match="entered twice"), context:
                pass
    assert [s.name for s in _spans(tmp_path)] == ["x", "c"]


def test_a_span_with_an_impossible_field_is_dropped_with_a_warning(tmp_path: Path) -> None:
    collector = Collector(tmp_path, 0, 1, heartbeat_interval_s=None)
    collector.record("fine", Category.COMPUTE, 0, 1)
    collector.record("huge", Category.COMPUTE, 1, 2, nbytes=2**70)  # does not fit the file's 64 bits
    collector.record("fine too", Category.COMPUTE, 2, 3)
    with pytest.warns(UserWarning, match="a span was dropped"):
        collector.flush(wait=True)
    collector.close()
    assert [s.name for s in _spans(tmp_path)] == ["fine", "fine too"]


def test_unknown_category_is_refused(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector, pytest.raises(ValueError, match="category"):
        collector.span("x", "gpu")  # type: ignore[arg-type]


def test_clock_reference_maps_monotonic_to_wall_time(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None):
        pass
    clock = read_rank_clock(tmp_path, 0)
    assert clock.end is not None and clock.rank == 0
    assert 0 <= clock.start.uncertainty_ns < 1_000_000
    reader = read_trace(layout.trace_path(tmp_path, 0))
    assert reader.clock == clock
    # An independent reading of both clocks agrees with the mapping to well within a few milliseconds.
    mono, wall = time.monotonic_ns(), time.time_ns()
    assert abs(clock.start.to_wall_ns(mono) - wall) < 5_000_000
    assert abs(clock.end.to_wall_ns(mono) - wall) < 5_000_000


def test_trace_without_its_clock_file_still_reads(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        collector.record("a", Category.COMPUTE, 1, 2)
    layout.clock_path(tmp_path, 0).unlink()
    reader = read_trace(layout.trace_path(tmp_path, 0))
    assert reader.clock is None and reader.clock_error is not None
    assert [s.name for s in reader] == ["a"]


def test_torn_final_record_is_ignored(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        for index in range(3):
            collector.record("a", Category.COMPUTE, index, index + 1)
    path = layout.trace_path(tmp_path, 0)
    data = path.read_bytes()
    for cut in (1, 10, fmt.SPAN.size - 1):
        path.write_bytes(data[:-cut])
        reader = read_trace(path)
        assert [s.start_ns for s in reader] == [0, 1]
        assert reader.torn_bytes == fmt.SPAN.size - cut


def test_torn_string_record_is_ignored(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        collector.record("first", Category.COMPUTE, 0, 1)
        collector.flush()
        collector.record("a-much-longer-name", Category.COMPUTE, 1, 2)
    path = layout.trace_path(tmp_path, 0)
    data = path.read_bytes()
    # Cut inside the second flush's string record for the new name.
    cut_at = data.index(b"a-much-longer-name") + 4
    path.write_bytes(data[:cut_at])
    assert [s.name for s in read_trace(path)] == ["first"]


def test_garbled_middle_names_the_file_and_the_byte(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        for index in range(4):
            collector.record("a", Category.COMPUTE, index, index + 1)
    path = layout.trace_path(tmp_path, 0)
    data = bytearray(path.read_bytes())
    third = len(data) - 2 * fmt.SPAN.size
    data[third] = 0x7F  # not a record tag
    path.write_bytes(bytes(data))
    reader = read_trace(path)
    with pytest.raises(TraceInputError, match=f"corrupt trace at byte {third}: unknown record tag 127") as caught:
        list(reader)
    assert caught.value.path == path


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "empty file"),
        (b'{"traceEvents": []}', "not a deeptrace trace"),
        (fmt.MAGIC + b"\x01", "truncated header"),
    ],
)
def test_foreign_empty_and_truncated_files_are_explained(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "rank-0.dtr"
    path.write_bytes(content)
    with pytest.raises(TraceInputError, match=problem) as caught:
        read_trace(path)
    assert caught.value.path == path


def test_newer_trace_format_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.dtr"
    path.write_bytes(fmt.HEADER.pack(fmt.MAGIC, fmt.TRACE_FORMAT_VERSION + 1, fmt.HEADER.size, 0, 1))
    with pytest.raises(TraceInputError, match="upgrade deeptrace"):
        read_trace(path)


def test_missing_trace_is_explained(tmp_path: Path) -> None:
    with pytest.raises(TraceInputError, match="file not found"):
        read_trace(tmp_path / "rank-0.dtr")


def test_a_restarted_rank_keeps_the_earlier_attempt(tmp_path: Path) -> None:
    for name in ("first", "second"):
        with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
            collector.record(name, Category.COMPUTE, 0, 1)
    assert [s.name for s in _spans(tmp_path)] == ["second"]
    earlier = layout.trace_dir(tmp_path) / "rank-0.attempt-1.dtr"
    assert [s.name for s in read_trace(earlier)] == ["first"]
    assert (layout.trace_dir(tmp_path) / "rank-0.attempt-1.clock.json").is_file()
    assert trace_paths(tmp_path) == {0: layout.trace_path(tmp_path, 0)}


def test_tracing_off_keeps_the_heartbeat_but_writes_no_trace(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None, trace=False) as collector:
        collector.step_begin(0)
        collector.step_end(0)
    assert not layout.trace_path(tmp_path, 0).exists()
    assert layout.heartbeat_path(tmp_path, 0).is_file()


_optional = st.one_of(st.none(), st.integers(0, 2**40))
_span_fields = st.tuples(
    st.text(min_size=1, max_size=12),
    st.sampled_from(list(Category)),
    st.integers(0, 2**62),
    st.integers(0, 2**20),
    st.sampled_from(["main", "cuda:0", "stream 7"]),
    _optional,
    st.one_of(st.none(), st.integers(0, 2**30)),
    _optional,
    st.one_of(st.none(), st.sampled_from(["dp", "ep", "tp"])),
    _optional,
)


@settings(max_examples=40, deadline=None)
@given(fields=st.lists(_span_fields, max_size=30), buffer_spans=st.integers(1, 8))
def test_any_recorded_spans_read_back_identically(
    tmp_path_factory: pytest.TempPathFactory, fields: list[tuple], buffer_spans: int
) -> None:
    run_dir = tmp_path_factory.mktemp("trace")
    expected = []
    with Collector(run_dir, 0, 1, heartbeat_interval_s=None, buffer_spans=buffer_spans) as collector:
        for name, category, start, length, track, step, layer, nbytes, group, seq in fields:
            collector.record(
                name,
                category,
                start,
                start + length,
                step=step,
                layer=layer,
                nbytes=nbytes,
                group=group,
                seq=seq,
                track=track,
            )
            expected.append(Span(name, category, start, start + length, track, step, layer, nbytes, group, seq))
    assert _spans(run_dir) == expected


def test_spans_of_a_job_that_never_closes_reach_the_file_at_exit(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from deeptrace.collect import Collector\n"
        "from deeptrace.spans import Category\n"
        "collector = Collector(sys.argv[1], 0, 1)\n"
        "collector.record('unflushed', Category.COMPUTE, 1, 2)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=120)
    assert [s.name for s in _spans(tmp_path)] == ["unflushed"]


def test_a_forked_child_never_blocks_on_the_parents_writer(tmp_path: Path) -> None:
    collector = Collector(tmp_path, 0, 1, heartbeat_interval_s=None)
    collector.record("parent", Category.COMPUTE, 0, 1)
    pid = os.fork()
    if pid == 0:  # the child: its copy has no writer thread; flushing must return, not wait forever
        signal.alarm(20)  # should it block, the child dies and the test fails instead of hanging
        collector.record("child", Category.COMPUTE, 1, 2)
        collector.flush(wait=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    collector.close()
    assert [s.name for s in _spans(tmp_path)] == ["parent"]
