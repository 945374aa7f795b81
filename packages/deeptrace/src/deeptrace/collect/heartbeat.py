"""The heartbeat: a rank's position (step, open span, collectives) kept in memory, written to disk by a thread.

The training thread only assigns a few attributes of `LiveHeartbeat` per event (nanoseconds); a daemon thread
turns them into heartbeat/rank-{R}.json every `interval_s` and whenever `wake()` is called (the collector calls it
at step end). The file is replaced atomically, so a reader never sees half a heartbeat, and it keeps being
rewritten while the training thread is blocked: during a hang it shows the collective or span the rank is stuck in.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from deeptrace.rundir import layout
from deeptrace.rundir.jsonio import dumps, write_atomically
from deeptrace.rundir.records import ClockRef, CollectiveMark, Heartbeat, HeartbeatState, PhaseMark, SpanMark


class OpenSpan(Protocol):
    """A span entered and not yet left (the collector's span objects): the heartbeat reports the innermost."""

    name: str
    category: str
    step: int | None
    start_ns: int


class OpenPhase(Protocol):
    """A phase announced with `Collector.phase` and not yet ended."""

    name: str
    start_ns: int


class CollectiveEvent(Protocol):
    """The collector's collective object last entered or left: read for its name, group, seq and times."""

    name: str
    group: str
    seq: int | None
    start_ns: int
    end_ns: int


class GroupMarks:
    """One process group's place: the next sequence number to enter (so the last entered is one less), and the
    collectives last entered and last left (the context objects: one store each on the hot path). The collector's
    own counter, so that entering a collective stores the mark at no extra cost."""

    __slots__ = ("entered", "left", "next_seq")

    def __init__(self) -> None:
        self.next_seq = 0
        self.entered: CollectiveEvent | None = None
        self.left: CollectiveEvent | None = None

    def left_seq(self) -> int | None:
        left = self.left
        return None if left is None else left.seq


class Marks(Protocol):
    """A group's marks as the heartbeat reads them: GroupMarks here, or the C hot path's (native.py)."""

    @property
    def next_seq(self) -> int: ...
    @property
    def entered(self) -> CollectiveEvent | None: ...
    @property
    def left(self) -> CollectiveEvent | None: ...
    def left_seq(self) -> int | None: ...


class OpenChain(Protocol):
    """The training thread's state (the collector's ThreadState): its innermost open span, None outside any."""

    top: Any


@dataclass(slots=True)
class LiveHeartbeat:
    """What the heartbeat says, in monotonic nanoseconds; mutated by the training thread, read by the writer."""

    rank: int
    world_size: int
    host: str
    pid: int
    state: HeartbeatState = "running"
    last_event_ns: int = 0
    step: int | None = None
    step_done: int | None = None
    # The collector's per-group sequence numbers, with each group's collectives last entered and left.
    groups: dict[str, Marks] = field(default_factory=dict)
    main_thread: OpenChain | None = None  # the training thread's chain of open spans
    # The collector's buffer (the same list): a span's end is progress, found there rather than stored per span.
    records: list[Any] = field(default_factory=list)
    error: str | None = None
    phases: list[OpenPhase] = field(default_factory=list)  # announced long phases, outermost first
    thread_id: int | None = None  # threading.get_ident() of the training thread
    stack_signal: int | None = None  # the signal of the in-process stack dump, when installed

    def innermost_open(self) -> OpenSpan | None:
        return None if self.main_thread is None else self.main_thread.top

    def entered(self) -> CollectiveEvent | None:
        """The collective entered last, of any group (each group keeps its own)."""
        marks = [m.entered for m in list(self.groups.values()) if m.entered is not None]
        return max(marks, key=lambda event: event.start_ns, default=None)

    def left(self) -> CollectiveEvent | None:
        """The collective left last, of any group."""
        marks = [m.left for m in list(self.groups.values()) if m.left is not None]
        return max(marks, key=lambda event: event.end_ns, default=None)

    def latest_progress_ns(self) -> int:
        """The latest event: a step boundary (stored as it happens), the last collective's entry or exit, the
        innermost open span's start, or the end of the newest span in the buffer. The buffer belongs to other
        threads and may change under our feet, hence the suppressed IndexError."""
        latest = self.last_event_ns
        entered, left, innermost = self.entered(), self.left(), self.innermost_open()
        if entered is not None:
            latest = max(latest, entered.start_ns)
        if left is not None:
            latest = max(latest, left.end_ns)
        if innermost is not None:
            latest = max(latest, innermost.start_ns)
        with contextlib.suppress(IndexError):
            latest = max(latest, _context_end(self.records[-1]))
        return latest

    def note_progress_in(self, items: list[Any]) -> None:
        """Remember the newest span end of items leaving the buffer (they no longer show in `records`)."""
        for item in reversed(items):
            end = _context_end(item)
            if end:
                self.last_event_ns = max(self.last_event_ns, end)
                return

    def snapshot(self, clock: ClockRef, written_ns: int) -> Heartbeat:
        def wall_s(mono_ns: int) -> float:
            return clock.to_wall_ns(mono_ns) / 1e9

        def mark(event: CollectiveEvent, at_ns: int) -> CollectiveMark | None:
            if event.seq is None:  # not possible once entered
                return None
            return CollectiveMark(name=event.name, group=event.group, seq=event.seq, wall_s=wall_s(at_ns))

        innermost = self.innermost_open()
        phase = self.phases[-1] if self.phases else None
        entered, left = self.entered(), self.left()
        last_event_ns = self.latest_progress_ns()
        return Heartbeat(
            rank=self.rank,
            world_size=self.world_size,
            host=self.host,
            pid=self.pid,
            state=self.state,
            written_wall_s=wall_s(written_ns),
            last_event_wall_s=wall_s(last_event_ns),
            step=self.step,
            step_done=self.step_done,
            open_span=None
            if innermost is None
            else SpanMark(innermost.name, str(innermost.category), innermost.step, wall_s(innermost.start_ns)),
            collective_entered=None if entered is None else mark(entered, entered.start_ns),
            collective_left=None if left is None else mark(left, left.end_ns),
            groups={group: (marks.next_seq - 1, marks.left_seq()) for group, marks in list(self.groups.items())},
            error=self.error,
            format_version=layout.FORMAT_VERSION,
            phase=None if phase is None else PhaseMark(phase.name, wall_s(phase.start_ns)),
            thread_id=self.thread_id,
            stack_signal=self.stack_signal,
        )


MIN_GAP_S = 0.5  # at most 2 rewrites a second, however short the steps


def _context_end(item: object) -> int:
    """The end of a span the collector timed itself; 0 for spans timed elsewhere (their times may be anything)."""
    return 0 if isinstance(item, tuple) else int(getattr(item, "end_ns", 0))


class HeartbeatWriter:
    """Rewrites one rank's heartbeat file from a daemon thread; `interval_s=None` writes only when asked."""

    def __init__(self, run_dir: Path, state: LiveHeartbeat, clock: ClockRef, interval_s: float | None = 1.0) -> None:
        self.path = layout.heartbeat_path(run_dir, state.rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.state = state
        self.clock = clock
        self.interval_s = interval_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one writer of the file at a time (thread and explicit writes)
        self._thread: threading.Thread | None = None
        self._last_write_ns = 0
        self._warned = False
        self.write()
        if interval_s is not None:
            self._thread = threading.Thread(target=self._run, name=f"deeptrace-heartbeat-{state.rank}", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        assert self.interval_s is not None
        # Step ends faster than this would rewrite the file at every step: space those writes.
        min_gap_ns = int(min(MIN_GAP_S, self.interval_s) * 1e9)
        while True:
            woken = self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            since_ns = time.monotonic_ns() - self._last_write_ns
            if woken and since_ns < min_gap_ns and self._stop.wait((min_gap_ns - since_ns) / 1e9):
                return
            self._write_or_warn()

    def _write_or_warn(self) -> None:
        """Write; a failure (disk full, folder removed) is said once and never stops the job: the next one retries."""
        try:
            self.write()
        except Exception as error:
            if not self._warned:
                self._warned = True
                warnings.warn(f"deeptrace: heartbeat not written to {self.path}: {error!r}", stacklevel=1)

    def write(self) -> None:
        """Write the heartbeat file now, from the calling thread."""
        with self._lock:
            self._last_write_ns = now = time.monotonic_ns()
            heartbeat = self.state.snapshot(self.clock, now)
            # No fsync: rewritten every few seconds, sometimes from the training thread, and a heartbeat lost to a
            # power cut matters no more than the run it described.
            write_atomically(self.path, dumps(heartbeat.to_dict(), indent=True), fsync=False)

    def wake(self) -> None:
        """Ask the thread to write soon (cheap: the training thread does not wait for the disk)."""
        self._wake.set()

    def stop(self, final_state: HeartbeatState) -> None:
        """Stop the thread and write the last heartbeat with `final_state`."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.state.state = final_state
        self._write_or_warn()
