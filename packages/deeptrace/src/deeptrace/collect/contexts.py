"""The hot path of the collector: the objects behind `with collector.span(...)` and `with collector.collective(...)`.

Every line here runs once or twice per span, so lookups are inlined and records are built already encoded for
the file (a tuple `pack(*record)` writes as is; missing values already replaced by their sentinels).
"""

from __future__ import annotations

from time import monotonic_ns
from typing import TYPE_CHECKING, Any

from deeptrace.collect import trace_format as fmt
from deeptrace.spans import Category

if TYPE_CHECKING:
    from deeptrace.collect.collector import Collector

# (tag, category code, name id, track id, group id, start ns, end ns, step, layer, seq, nbytes): fmt.SPAN's fields
Record = tuple[int, int, int, int, int, int, int, int, int, int, int]

TAG = fmt.TAG_SPAN
NONE_I32 = fmt.NONE_I32
NONE_I64 = fmt.NONE_I64
NO_STRING = fmt.NO_STRING
COMM_CODE = fmt.CATEGORY_CODES[Category.COMM]


class ThreadTracks:
    """Per thread: its stack of open spans (nesting, heartbeat) and its track ids by nesting depth."""

    __slots__ = ("base", "stack", "tracks")

    def __init__(self, base: str, stack: list[Any]) -> None:
        self.base = base
        self.stack = stack
        self.tracks: list[int] = []


class SpanContext:
    """`with collector.span(...)`: times the block and records it as one span."""

    __slots__ = ("_collector", "_thread", "category", "code", "layer", "name", "name_id", "nbytes", "start_ns", "step")

    # Positional on purpose: keyword passing costs a noticeable share of a span.
    def __init__(  # noqa: PLR0917
        self, collector: Collector, name: str, category: Category, step: int, layer: int, nbytes: int
    ) -> None:
        self._collector = collector
        self.name = name
        # Inlined lookups for the common case (a known name): a method call costs as much as the rest of a span.
        name_id = collector._ids.get(name)
        self.name_id = collector._intern(name) if name_id is None else name_id
        self.category = category
        code = collector._code_of.get(category)
        self.code = collector._category_code(category) if code is None else code
        self.step = step  # encoded: NONE_I64 when absent
        self.layer = layer
        self.nbytes = nbytes
        self.start_ns = 0

    def __enter__(self) -> SpanContext:
        collector = self._collector
        try:
            thread = collector._local.tracks
        except AttributeError:  # the first span of this thread
            thread = collector._thread()
        self._thread = thread
        thread.stack.append(self)
        # No heartbeat store here: the heartbeat counts the innermost open span's start as progress.
        self.start_ns = monotonic_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        end = monotonic_ns()
        collector = self._collector
        thread = self._thread
        stack = thread.stack
        stack.pop()
        collector._live.last_event_ns = end
        depth = len(stack)
        try:
            track = thread.tracks[depth]
        except IndexError:
            track = collector._track_id(thread, depth)
        buffer = collector._buffer
        buffer.append(
            (
                TAG,
                self.code,
                self.name_id,
                track,
                NO_STRING,
                self.start_ns,
                end,
                self.step,
                self.layer,
                NONE_I64,
                self.nbytes,
            )
        )
        if len(buffer) >= collector._buffer_limit:
            collector.flush()


class CollectiveContext:
    """`with collector.collective(...)`: a COMM span with its group's next sequence number, tracked by the heartbeat."""

    __slots__ = (
        "_collector",
        "_thread",
        "category",
        "group",
        "group_id",
        "name",
        "name_id",
        "nbytes",
        "seq",
        "start_ns",
        "step",
    )

    def __init__(  # noqa: PLR0917
        self, collector: Collector, name: str, group: str, seq: int | None, step: int, nbytes: int
    ) -> None:
        self._collector = collector
        self.name = name
        name_id = collector._ids.get(name)
        self.name_id = collector._intern(name) if name_id is None else name_id
        self.group = group
        group_id = collector._ids.get(group)
        self.group_id = collector._intern(group) if group_id is None else group_id
        self.category = Category.COMM
        self.seq = seq  # assigned on entry when None
        self.step = step
        self.nbytes = nbytes
        self.start_ns = 0

    def __enter__(self) -> CollectiveContext:
        collector = self._collector
        live = collector._live
        group = self.group
        seq = self.seq
        if seq is None:
            seq = self.seq = collector._next_seq.get(group, 0)
        collector._next_seq[group] = seq + 1
        try:
            thread = collector._local.tracks
        except AttributeError:  # the first span of this thread
            thread = collector._thread()
        self._thread = thread
        thread.stack.append(self)
        self.start_ns = start = monotonic_ns()
        live.entered = (self.name, group, seq, start)
        marks = live.groups.get(group)
        if marks is None:
            live.groups[group] = [seq, None]
        else:
            marks[0] = seq
        live.last_event_ns = start
        return self

    def __exit__(self, *exc: object) -> None:
        end = monotonic_ns()
        collector = self._collector
        live = collector._live
        thread = self._thread
        stack = thread.stack
        stack.pop()
        seq = self.seq if self.seq is not None else NONE_I64
        live.left = (self.name, self.group, seq, end)
        live.groups[self.group][1] = seq
        live.last_event_ns = end
        depth = len(stack)
        try:
            track = thread.tracks[depth]
        except IndexError:
            track = collector._track_id(thread, depth)
        buffer = collector._buffer
        buffer.append(
            (
                TAG,
                COMM_CODE,
                self.name_id,
                track,
                self.group_id,
                self.start_ns,
                end,
                self.step,
                NONE_I32,
                seq,
                self.nbytes,
            )
        )
        if len(buffer) >= collector._buffer_limit:
            collector.flush()
