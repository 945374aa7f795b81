"""The hot path of the collector: the objects behind `with collector.span(...)` and `with collector.collective(...)`.

Every line here runs once or twice per span, between the training code's own work, with cold caches, so it does
the least that must happen at once: take the time, keep the nesting (and the heartbeat) right, append the
finished context object itself to the collector's buffer. Turning it into a file record (string ids, tracks,
packing) is the writer thread's job (`trace_writer.SpanEncoder`).
"""

from __future__ import annotations

from threading import get_ident
from time import monotonic_ns
from typing import TYPE_CHECKING, Any, TypeAlias

from deeptrace.collect import trace_format as fmt
from deeptrace.collect.heartbeat import GroupMarks
from deeptrace.spans import Category

if TYPE_CHECKING:
    from deeptrace.collect import _hotpath
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
    """Per thread: its name as a track, its innermost open span, and the collector's buffer and its limit.

    The open spans form a chain through each context's `parent` (no list: a push or pop would be a method call and
    two more objects to fetch after the training code's work has evicted them). The buffer is kept here too, so
    that leaving a span touches the context and this object only, not the collector.
    """

    __slots__ = ("base", "buffer", "limit", "top")

    def __init__(self, base: str, buffer: list[Any], limit: int) -> None:
        self.base = base
        self.top: Any = None  # the innermost open span (SpanContext | CollectiveContext), None outside any
        self.buffer = buffer
        self.limit = limit


class SpanContext:
    """`with collector.span(...)`: times the block; the finished object is the buffered span."""

    __slots__ = (
        "category",
        "collector",
        "end_ns",
        "layer",
        "name",
        "nbytes",
        "parent",
        "start_ns",
        "step",
        "thread",
    )

    # Made by Collector.span (object.__new__ and a few stores: a Python __init__ frame costs a noticeable share).
    # One context records one span: start_ns is 0 until it is entered, and a second entry is refused.
    collector: Collector
    name: str
    category: Category
    step: int | None
    layer: int | None
    nbytes: int | None
    start_ns: int
    end_ns: int
    # The span that was innermost when this one was entered (its depth is the length of that chain, counted by the
    # writer thread), or for a begun one the number of its lane.
    parent: SpanContext | CollectiveContext | int | None
    thread: ThreadState

    def __enter__(self) -> SpanContext:
        if self.start_ns:
            raise reused(self.name)
        collector = self.collector
        thread = collector._main_state if get_ident() == collector._main_ident else collector._thread()
        self.thread = thread
        self.parent = thread.top
        self.start_ns = monotonic_ns()  # before it becomes the top: the heartbeat thread reads its start
        thread.top = self
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:  # no *args: a tuple per call
        self.end_ns = monotonic_ns()
        thread = self.thread
        if thread.top is self:  # else begun with begin(): never the top
            thread.top = self.parent
        # No heartbeat store: the heartbeat finds this span's end as the newest item of the buffer.
        buffer = thread.buffer
        buffer.append(self)
        if len(buffer) >= thread.limit:
            self.collector.flush()

    def begin(self) -> SpanContext:
        """Start where a `with` block does not fit (a hook that starts what another hook ends); `end()` ends it.

        A begun span is in flight beside the thread's nested spans, not inside them: it goes on a lane track of
        its own (`<thread>/async-<k>`, the first lane free), so begun spans may end in any order.
        """
        self.__enter__()
        take_lane(self)
        return self

    def end(self) -> None:
        """End a span started with `begin()`."""
        free_lane(self)
        self.__exit__(None, None, None)


class CollectiveContext:
    """`with collector.collective(...)`: a COMM span with its group's next sequence number, tracked by the heartbeat."""

    __slots__ = (
        "collector",
        "end_ns",
        "group",
        "marks",
        "name",
        "nbytes",
        "parent",
        "seq",
        "start_ns",
        "step",
        "thread",
    )

    category = Category.COMM
    # Made by Collector.collective, like SpanContext.
    collector: Collector
    name: str
    group: str
    seq: int | None  # assigned on entry when None
    marks: GroupMarks  # set on entry
    step: int | None
    nbytes: int | None
    start_ns: int
    end_ns: int
    parent: SpanContext | CollectiveContext | int | None  # as SpanContext.parent
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
        self.parent = thread.top
        self.start_ns = monotonic_ns()
        thread.top = self
        # The heartbeat reads name, group, seq and start from the object: one store, on the marks just touched.
        marks.entered = self
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.end_ns = monotonic_ns()
        thread = self.thread
        if thread.top is self:  # else begun with begin(): never the top
            thread.top = self.parent
        self.marks.left = self  # after end_ns: the heartbeat reads it
        buffer = thread.buffer
        buffer.append(self)
        if len(buffer) >= thread.limit:
            self.collector.flush()

    def begin(self) -> CollectiveContext:
        """Enter where a `with` block does not fit (an asynchronous collective issued here, waited for elsewhere);
        `end()` leaves it. Like SpanContext.begin, it goes on a lane track and begun ones may end in any order."""
        self.__enter__()
        take_lane(self)
        return self

    def end(self) -> None:
        """Leave a collective entered with `begin()`."""
        free_lane(self)
        self.__exit__(None, None, None)


if TYPE_CHECKING:
    # A context of either hot path (the C one, native.py, has the same attributes); for annotations only.
    TimedContext: TypeAlias = SpanContext | CollectiveContext | _hotpath.SpanContext | _hotpath.CollectiveContext


def take_lane(context: TimedContext) -> None:
    """Take a just-entered context out of its thread's chain of open spans onto the first free lane of that thread."""
    thread = context.thread
    if thread.top is context:
        thread.top = context.parent
    lanes = context.collector._lanes.setdefault(thread.base, [])
    free = next((index for index, busy in enumerate(lanes) if not busy), len(lanes))
    if free == len(lanes):
        lanes.append(True)
    else:
        lanes[free] = True
    context.parent = free  # an int parent marks the context as begun, and says its lane


def free_lane(context: TimedContext) -> None:
    lane = getattr(context, "parent", None)  # unset until entered
    if not isinstance(lane, int):
        raise RuntimeError(f"end() of {context.name!r}, which was not started with begin()")
    context.collector._lanes[context.thread.base][lane] = False


def open_depth(top: TimedContext | int | None) -> int:
    """How many spans are open in a chain whose innermost is `top` (the depth a span entered now gets)."""
    depth = 0
    while top is not None and not isinstance(top, int):
        depth += 1
        top = top.parent
    return depth


def track_key(context: TimedContext) -> tuple[str, int]:
    """(thread, depth) of a finished context, with depth -1 - lane for a begun one: what names its track."""
    parent = context.parent
    if type(parent) is int:
        return context.thread.base, -1 - parent
    return context.thread.base, open_depth(parent)


def track_name(key: tuple[str, int]) -> str:
    """The track of a track_key: `<thread>`, `<thread>/<depth>` for nested ones, `<thread>/async-<k>` for lanes."""
    base, depth = key
    if depth < 0:
        return f"{base}/async-{-1 - depth}"
    return base if depth == 0 else f"{base}/{depth}"
