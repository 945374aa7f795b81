"""The span collector: what a training loop calls to record its spans, collectives, steps and heartbeat.

    collector = Collector(run_dir, rank, world_size)
    for step in range(n):
        collector.step_begin(step)
        with collector.span("forward", Category.COMPUTE, layer=3):
            ...
        with collector.collective("all_gather", group="dp", nbytes=...):
            ...
        collector.step_end(step)
    collector.close()

Recording a span costs its context object, two clock reads, and the object appended to a list: a fraction of a
microsecond with the C hot path (native.py; built where a C compiler exists), one or two microseconds without. At
`step_end` (or when the buffer fills) the batch is handed to a writer thread that packs and appends it to the file;
the heartbeat is a few attribute stores, written to disk by another daemon thread. The collector must never take
the training job down: a failing disk write is reported by a warning and the data dropped.
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from pathlib import Path
from threading import get_ident
from time import monotonic_ns
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deeptrace.collect import _hotpath
    from deeptrace.collect.trace_writer import BufferItem

from deeptrace.collect import trace_format as fmt
from deeptrace.collect.contexts import (
    KNOWN_CATEGORIES,
    CollectiveContext,
    RawSpan,
    SpanContext,
    ThreadState,
    free_lane,
    open_depth,
    reused,
    take_lane,
    unknown_category,
)
from deeptrace.collect.heartbeat import GroupMarks, HeartbeatWriter, LiveHeartbeat
from deeptrace.collect.native import native_chosen, native_module
from deeptrace.collect.phase import PhaseContext, phase_category
from deeptrace.collect.stackdump import DEFAULT_STACK_SIGNAL, StackDump
from deeptrace.collect.trace_writer import TraceFileWriter
from deeptrace.rundir import layout
from deeptrace.rundir.jsonio import dumps, write_atomically
from deeptrace.rundir.records import ClockRef, HeartbeatState, RankClock
from deeptrace.rundir.writer import RunDirectoryError, process_identity
from deeptrace.spans import Category

_new = object.__new__


class _ThreadEnd:
    """Kept only in the creating thread's thread-local data, so that it dies with that thread."""

    __slots__ = ("__weakref__",)


def _forget_main_thread(collector: weakref.ref[Collector]) -> None:
    alive = collector()
    if alive is not None:
        alive._main_ident = None
        if alive._hub is not None:
            alive._hub.main_ident = None


class Collector:
    """Records one rank's spans into RUN_DIR/trace/rank-{R}.dtr and keeps RUN_DIR/heartbeat/rank-{R}.json.

    Args:
        run_dir: the run directory (created if missing).
        rank, world_size: this process's place in the job.
        heartbeat_interval_s: how often the daemon thread rewrites the heartbeat (also soon after each step end);
            None: no thread, the heartbeat is written at start, at close and by `write_heartbeat()`.
        buffer_spans: spans kept in memory before a write even without a step end.
        trace: False keeps heartbeats (for hang diagnosis) but writes no span file.
        stack_signal: the signal on which the rank dumps every thread's Python stack into RUN_DIR/stacks/rank-R.txt
            (faulthandler, from the C signal handler, so it works while the training thread is blocked in C code
            and where the kernel refuses ptrace); `deeptrace watch` sends it. None installs nothing.

    Spans nest: a span opened inside another on the same thread goes on the track `<thread>/<depth>` (the
    outermost on `<thread>`, which is `main` for the thread that made the collector), so that spans on one track
    never overlap. Step windows are recorded as spans named "step" on the track "steps".
    """

    def __init__(
        self,
        run_dir: Path | str,
        rank: int,
        world_size: int,
        *,
        heartbeat_interval_s: float | None = 1.0,
        buffer_spans: int = 8192,
        trace: bool = True,
        stack_signal: int | None = DEFAULT_STACK_SIGNAL,
    ) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise RunDirectoryError(f"rank {rank} is not within world size {world_size}: pass 0 <= rank < world_size")
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.world_size = world_size
        self.trace = trace
        self._buffer: list[BufferItem] = []
        self._buffer_limit = max(1, buffer_spans)
        self._flush_lock = threading.Lock()
        self._step: int | None = None
        self._step_start_ns: int | None = None
        self._closed = False
        host, pid = process_identity()
        self._pid = pid  # a forked child (a data-loader worker) inherits this object but none of its threads
        self._live = LiveHeartbeat(rank=rank, world_size=world_size, host=host, pid=pid, records=self._buffer)
        # Per group: next sequence number, last entered and left (shared with the heartbeat); the GroupMarks of the
        # hot path in use (heartbeat.GroupMarks or the C module's).
        self._groups: dict[str, Any] = self._live.groups
        # Per-thread state lives in a threading.local: it dies with its thread, while thread idents get reused.
        self._local = threading.local()
        # The C hot path where it is built (native.py): the same objects, a fraction of the cost per span.
        self._native = native_module() if native_chosen() else None
        self._thread_state_type: Any = ThreadState if self._native is None else self._native.ThreadState
        self._marks_type: Any = GroupMarks if self._native is None else self._native.GroupMarks
        self._local.state = self._main_state = self._thread_state_type("main", self._buffer, self._buffer_limit)
        self._live.main_thread = self._main_state
        # The hot path finds the creating thread by its ident (cheaper than the threading.local, and in a step it
        # touches less memory). An ident is reused after its thread ends, so the end of the creating thread (its
        # thread-local data dies with it) turns that shortcut off.
        self._main_ident: int | None = threading.get_ident()
        self._local.end_marker = marker = _ThreadEnd()
        weakref.finalize(marker, _forget_main_thread, weakref.ref(self)).atexit = False
        self._lanes: dict[str, list[bool]] = {}  # per thread track: which async lanes are busy (begin/end)
        self._hub: _hotpath.Hub | None = None
        if self._native is not None:
            self._hub = self._native.Hub(
                main_ident=threading.get_ident(),
                main_state=self._main_state,
                groups=self._groups,
                categories=KNOWN_CATEGORIES,
                comm=Category.COMM,
                collector=self,
                thread_state=self._thread,
                flush=self.flush,
                new_group=self._new_group,
                take_lane=take_lane,
                free_lane=free_lane,
                reused=reused,
                unknown_category=unknown_category,
            )
            # The two recording methods become the hub's, called with no Python frame in between: an instance
            # attribute is found before the class's method. Their signatures and results are the methods' below.
            self.__dict__["span"] = self._hub.span
            self.__dict__["collective"] = self._hub.collective

        self.clock = ClockRef.measure()
        self._live.last_event_ns = self.clock.mono_ns
        self._rank_clock = RankClock(
            rank=rank, host=host, pid=pid, start=self.clock, format_version=layout.FORMAT_VERSION
        )
        self._writer: TraceFileWriter | None = None
        if trace:
            layout.trace_dir(self.run_dir).mkdir(parents=True, exist_ok=True)
            self._set_aside_previous_attempt()
            self._writer = TraceFileWriter(layout.trace_path(self.run_dir, rank), rank, world_size, self._native)
            self._write_clock()
        self._live.thread_id = self._main_ident
        self._stack_dump = StackDump.install(self.run_dir, rank, stack_signal)
        self._live.stack_signal = None if self._stack_dump is None else self._stack_dump.signal
        self._heartbeat = HeartbeatWriter(self.run_dir, self._live, self.clock, heartbeat_interval_s)
        # A job that ends without close() still gets its buffered spans on disk (the heartbeat stays as it was:
        # nothing here knows whether the run ended well).
        atexit.register(self._flush_at_exit)

    # ---- recording -------------------------------------------------------------------------------------------

    def span(
        self,
        name: str,
        category: Category,
        *,
        step: int | None = None,
        layer: int | None = None,
        nbytes: int | None = None,
    ) -> SpanContext:
        """Time a block: `with collector.span("forward", Category.COMPUTE, layer=3): ...`.

        `step` defaults to the step begun last.
        """
        if category not in KNOWN_CATEGORIES:
            raise unknown_category(category)
        context = _new(SpanContext)
        context.collector = self
        context.name = name
        context.category = category
        context.step = self._step if step is None else step
        context.layer = layer
        context.nbytes = nbytes
        context.start_ns = 0
        return context

    def collective(
        self,
        name: str,
        group: str = "world",
        *,
        nbytes: int | None = None,
        seq: int | None = None,
        step: int | None = None,
    ) -> CollectiveContext:
        """Time a collective: the next sequence number of `group` (unless `seq` is given), a COMM span, heartbeat.

        Every rank of a group calls its collectives in the same order, so (group, seq) names the same collective
        on every rank: that is how the analysis matches them and how the hang diagnosis finds who never arrived.
        """
        context = _new(CollectiveContext)
        context.collector = self
        context.name = name
        context.group = group
        context.seq = seq
        context.step = self._step if step is None else step
        context.nbytes = nbytes
        context.start_ns = 0
        return context

    def record(
        self,
        name: str,
        category: Category,
        start_ns: int,
        end_ns: int,
        *,
        step: int | None = None,
        layer: int | None = None,
        nbytes: int | None = None,
        group: str | None = None,
        seq: int | None = None,
        track: str | None = None,
    ) -> None:
        """Record an interval timed elsewhere (e.g. by CUDA events), in `time.monotonic_ns()` nanoseconds.

        `track` names where it ran (a CUDA stream, say); by default the calling thread's track at its current depth.
        """
        if category not in KNOWN_CATEGORIES:
            raise unknown_category(category)
        if track is None:
            thread = self._main_state if get_ident() == self._main_ident else self._thread()
            depth = open_depth(thread.top)
            track = thread.base if depth == 0 else f"{thread.base}/{depth}"
        self._append(
            (name, category, start_ns, end_ns, track, self._step if step is None else step, layer, nbytes, group, seq)
        )

    def phase(self, name: str, category: Category | None = None) -> PhaseContext:
        """Announce a legitimately long phase: `with collector.phase("checkpoint"): save(...)`.

        While inside, the heartbeat says so (`phase`), and `deeptrace watch` shows the rank in that phase instead
        of calling it stuck, however long it takes; ranks that wait in a collective for a rank in a phase are not
        stuck either. The phase is also recorded as a span (category from the name: checkpoint*, data*, eval* ->
        CHECKPOINT, DATA, OTHER; or `category`). Phases nest; the innermost one is announced.
        """
        return PhaseContext(self, name, phase_category(name) if category is None else category)

    def step_begin(self, step: int) -> None:
        now = monotonic_ns()
        self._step = step
        if self._hub is not None:
            self._hub.step = step
        self._step_start_ns = now
        self._live.step = step
        self._live.last_event_ns = now

    def step_end(self, step: int) -> None:
        """Close the step: record its window, write the buffered spans, and have the heartbeat rewritten."""
        now = monotonic_ns()
        if self._step_start_ns is not None and self._step == step:
            start = self._step_start_ns
            self._append((fmt.STEP_SPAN_NAME, Category.OTHER, start, now, fmt.STEP_TRACK, step, None, None, None, None))
        self._step_start_ns = None
        self._live.step_done = step
        self._live.last_event_ns = now
        self.flush()
        self._heartbeat.wake()

    # ---- internals of the hot path ----------------------------------------------------------------------------

    def _append(self, item: RawSpan) -> None:
        buffer = self._buffer
        buffer.append(item)
        if len(buffer) >= self._buffer_limit:
            self.flush()

    def _new_group(self, group: str) -> Any:  # the hot path's GroupMarks
        return self._groups.setdefault(group, self._marks_type())

    def _thread(self) -> ThreadState:
        try:
            thread: ThreadState = self._local.state
        except AttributeError:
            thread = self._local.state = self._thread_state_type(
                threading.current_thread().name, self._buffer, self._buffer_limit
            )
        return thread

    # ---- writing ----------------------------------------------------------------------------------------------

    def flush(self, *, wait: bool = False) -> None:
        """Hand the buffered spans to the writer thread; `wait`: return once they are on disk."""
        with self._flush_lock:
            buffer = self._buffer
            count = len(buffer)  # spans appended after this point stay for the next flush
            items = buffer[:count]
            del buffer[:count]
            self._live.note_progress_in(items)
            if self._writer is None or self._closed or os.getpid() != self._pid:
                return
            self._writer.release_written()
            if items:
                self._writer.submit(items)
        if wait:
            self._writer.wait()

    def _write_clock(self) -> None:
        write_atomically(layout.clock_path(self.run_dir, self.rank), dumps(self._rank_clock.to_dict(), indent=True))

    def _set_aside_previous_attempt(self) -> None:
        """A restarted rank keeps its earlier trace: rank-R.dtr becomes rank-R.attempt-K.dtr (clock likewise)."""
        trace = layout.trace_path(self.run_dir, self.rank)
        if not trace.exists():
            return
        attempt = layout.next_attempt(self.run_dir, self.rank)
        trace.rename(layout.attempt_trace_path(self.run_dir, self.rank, attempt))
        clock = layout.clock_path(self.run_dir, self.rank)
        if clock.exists():
            clock.rename(layout.attempt_clock_path(self.run_dir, self.rank, attempt))

    def write_heartbeat(self) -> None:
        """Rewrite the heartbeat file now, from this thread (the daemon thread does it on its own otherwise)."""
        self._heartbeat.write()

    def close(self, final_state: HeartbeatState = "closed", error: str | None = None) -> None:
        """Flush, record the closing clock reference and leave the last heartbeat with `final_state`.

        `final_state="running"` leaves the heartbeat as a killed process would (tests use it to plant hangs).
        Calling close again does nothing.
        """
        if self._closed:
            return
        atexit.unregister(self._flush_at_exit)
        self.flush()
        self._closed = True
        if self._writer is not None:
            self._writer.close()
            self._rank_clock = RankClock(
                rank=self._rank_clock.rank,
                host=self._rank_clock.host,
                pid=self._rank_clock.pid,
                start=self._rank_clock.start,
                end=ClockRef.measure(),
                format_version=layout.FORMAT_VERSION,
            )
            self._write_clock()
        if error is not None:
            self._live.error = error
        self._heartbeat.stop(final_state)
        if self._stack_dump is not None:
            self._stack_dump.uninstall()

    def _flush_at_exit(self) -> None:
        if not self._closed and self._writer is not None:
            self.flush(wait=True)

    def __enter__(self) -> Collector:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.close("crashed", error=f"{exc_type.__name__}: {exc}")
