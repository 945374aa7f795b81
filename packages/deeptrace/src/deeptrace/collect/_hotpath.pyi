# The C hot path (_hotpath.c): the same attributes as contexts.py's classes and heartbeat.py's GroupMarks.
from typing import Any

from deeptrace.spans import Category

class ThreadState:
    base: str
    buffer: list[Any]
    limit: int
    top: Any
    def __init__(self, base: str, buffer: list[Any], limit: int) -> None: ...

class GroupMarks:
    next_seq: int
    entered: CollectiveContext | None
    left: CollectiveContext | None
    def left_seq(self) -> int | None: ...

class SpanContext:
    name: str
    category: Category
    step: int | None
    layer: int | None
    nbytes: int | None
    start_ns: int
    end_ns: int
    parent: SpanContext | CollectiveContext | int | None
    thread: ThreadState
    collector: Any
    def __enter__(self) -> SpanContext: ...
    def __exit__(self, exc_type: object, exc: object, tb: object) -> None: ...
    def begin(self) -> SpanContext: ...
    def end(self) -> None: ...

class CollectiveContext:
    name: str
    category: Category
    group: str
    seq: int | None
    marks: GroupMarks
    step: int | None
    nbytes: int | None
    start_ns: int
    end_ns: int
    parent: SpanContext | CollectiveContext | int | None
    thread: ThreadState
    collector: Any
    def __enter__(self) -> CollectiveContext: ...
    def __exit__(self, exc_type: object, exc: object, tb: object) -> None: ...
    def begin(self) -> CollectiveContext: ...
    def end(self) -> None: ...

class Hub:
    main_ident: int | None
    step: int | None
    def __init__(
        self,
        *,
        main_ident: int,
        main_state: ThreadState,
        groups: dict[str, GroupMarks],
        categories: frozenset[Category],
        comm: Category,
        collector: Any,
        thread_state: Any,
        flush: Any,
        new_group: Any,
        take_lane: Any,
        free_lane: Any,
        reused: Any,
        unknown_category: Any,
    ) -> None: ...
    def span(
        self,
        name: str,
        category: Category,
        *,
        step: int | None = None,
        layer: int | None = None,
        nbytes: int | None = None,
    ) -> SpanContext: ...
    def collective(
        self,
        name: str,
        group: str = "world",
        *,
        nbytes: int | None = None,
        seq: int | None = None,
        step: int | None = None,
    ) -> CollectiveContext: ...

def pack_records(items: list[Any], encoder: Any) -> bytes: ...
