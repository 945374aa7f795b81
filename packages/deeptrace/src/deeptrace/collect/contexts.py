"""The hot path of the collector: the objects behind `with collector.span(...)` and `with collector.collective(...)`.

Every line here runs once or twice per span, between the training code's own work, with cold caches, so it does
the least that must happen at once: take the time, keep the nesting (and the heartbeat) right, append the
finished context object itself to the collector's buffer. Turning it into a file record (string ids, tracks,
packing) is the writer thread's job (`trace_writer.SpanEncoder`).
"""

from __future__ import annotations

from threading import get_ident
from time import monotonic_ns
from typing import TYPE_CHECKING, Any

from deeptrace.collect import trace_format as fmt
from deeptrace.collect.heartbeat import GroupMarks
from deeptrace.spans import Category

if TYPE_CHECKING:
    from deeptrace.collect.collector import Collector

# A span timed elsewhere (Collector.record, step windows):
# (name, category, start ns, end ns, track, step, layer, nbytes, group, seq)
RawSpan = tuple[str, Category, int, int, str, int | None, int | None, int | None, str | None, int | None]

KNOWN_CATEGORIES = frozenset(fmt.CATEGORY_CODES)


def unknown_category(category: object) -> ValueError:
    return ValueError(f"unknown span category {category!r}: use one of {[str(c) for c in Category]}")


def reused(name: str) -> RuntimeError:
    # The finished context object is the buffered span, so entering it again would overwrite a recorded span.
    return RuntimeError(
        f"the span context of {name!r} was entered twice: each `with` needs a new collector.span(...) or "
        "collector.collective(...)"
    )


class ThreadState:
    """Per thread: its name as a track and its stack of open spans (nesting depth, heartbeat)."""

    __slots__ = ("base", "stack")

    def __init__(self, base: str, stack: list[Any]) -> None:
        self.base = base
        self.stack = stack


class SpanContext:
    """`with collector.span(...)`: times the block; the finished object is the buffered span."""

    __slots__ = (
        "category",
        "collector",
        "depth",
        "end_ns",
        "lane",
        "layer",
        "name",
        "nbytes",
        "start_ns",
        "step",
        "thread",
    )

    # Made by Collector.span (object.__new__ and a few stores: a Python __init__ frame costs a noticeable share).
    lane: int  # set only by begin()
    # One context records one span: start_ns is 0 until it is entered, and a second entry is refused.
    collector: Collector
    name: str
    category: Category
    step: int | None
    layer: int | None
    nbytes: int | None
    start_ns: int
    end_ns: int
    depth: int
    thread: ThreadState

    def __enter__(self) -> SpanContext:
        if self.start_ns:
            raise reused(self.name)
        collector = self.collector
        thread = collector._main_state if get_ident() == collector._main_ident else collector._thread()
        self.thread = thread
        stack = thread.stack
        self.depth = len(stack)
        self.start_ns = monotonic_ns()  # before the push: the heartbeat thread reads the stack's spans
        stack.append(self)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:  # no *args: a tuple per call
        self.end_ns = monotonic_ns()
        stack = self.thread.stack
        if stack and stack[-1] is self:  # else begun with begin(): never on the stack
            stack.pop()
        collector = self.collector
        # No heartbeat store: the heartbeat finds this span's end as the newest item of the buffer.
        buffer = collector._buffer
        buffer.append(self)
        if len(buffer) >= collector._buffer_limit:
            collector.flush()

    def begin(self) -> SpanContext:
        """Start where a `with` block does not fit (a hook that starts what another hook ends); `end()` ends it.

        A begun span is in flight beside the thread's nested spans, not inside them: it goes on a lane track of
        its own (`<thread>/async-<k>`, the first lane free), so begun spans may end in any order.
        """
        self.__enter__()
        _take_lane(self)
        return self

    def end(self) -> None:
        """End a span started with `begin()`."""
        _free_lane(self)
        self.__exit__(None, None, None)


class CollectiveContext:
    """`with collector.collective(...)`: a COMM span with its group's next sequence number, tracked by the heartbeat."""

    __slots__ = (
        "collector",
        "depth",
        "end_ns",
        "group",
        "lane",
        "marks",
        "name",
        "nbytes",
        "seq",
        "start_ns",
        "step",
        "thread",
    )

    category = Category.COMM
    # Made by Collector.collective, like SpanContext.
    lane: int  # set only by begin()
    collector: Collector
    name: str
    group: str
    seq: int | None  # assigned on entry when None
    marks: GroupMarks  # set on entry
    step: int | None
    nbytes: int | None
    start_ns: int
    end_ns: int
    depth: int
    thread: ThreadState

    def __enter__(self) -> CollectiveContext:
        if self.start_ns:
            raise reused(self.name)
        collector = self.collector
        # The group's marks are its sequence counter and the heartbeat's record of it at once.
        marks = collector._groups.get(self.group)
        if marks is None:
            marks = collector._new_group(self.group)
        self.marks = marks
        seq = self.seq
        if seq is None:
            seq = self.seq = marks.next_seq
        marks.next_seq = seq + 1
        thread = collector._main_state if get_ident() == collector._main_ident else collector._thread()
        self.thread = thread
        stack = thread.stack
        self.depth = len(stack)
        self.start_ns = monotonic_ns()
        stack.append(self)
        # The heartbeat reads name, group, seq and start from the object: one store, no tuple.
        collector._live.entered = self
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.end_ns = monotonic_ns()
        stack = self.thread.stack
        if stack and stack[-1] is self:  # else begun with begin(): never on the stack
            stack.pop()
        self.marks.left = self.seq
        collector = self.collector
        collector._live.left = self  # after end_ns: the heartbeat reads it
        buffer = collector._buffer
        buffer.append(self)
        if len(buffer) >= collector._buffer_limit:
            collector.flush()

    def begin(self) -> CollectiveContext:
        """Enter where a `with` block does not fit (an asynchronous collective issued here, waited for elsewhere);
        `end()` leaves it. Like SpanContext.begin, it goes on a lane track and begun ones may end in any order."""
        self.__enter__()
        _take_lane(self)
        return self

    def end(self) -> None:
        """Leave a collective entered with `begin()`."""
        _free_lane(self)
        self.__exit__(None, None, None)


def _take_lane(context: SpanContext | CollectiveContext) -> None:
    """Move a just-entered context off its thread's stack onto the first free lane of that thread."""
    stack = context.thread.stack
    if stack and stack[-1] is context:
        stack.pop()
    lanes = context.collector._lanes.setdefault(context.thread.base, [])
    free = next((index for index, busy in enumerate(lanes) if not busy), len(lanes))
    if free == len(lanes):
        lanes.append(True)
    else:
        lanes[free] = True
    context.lane = free
    context.depth = -1 - free  # marks the context as begun for track_of, without a lookup on every span


def _free_lane(context: SpanContext | CollectiveContext) -> None:
    context.collector._lanes[context.thread.base][context.lane] = False


def track_of(context: SpanContext | CollectiveContext) -> tuple[str, int] | str:
    """The track a finished context goes on: (thread, depth) for nested ones, a lane track for begun ones."""
    depth = context.depth
    if depth >= 0:
        return context.thread.base, depth
    return f"{context.thread.base}/async-{-1 - depth}"
