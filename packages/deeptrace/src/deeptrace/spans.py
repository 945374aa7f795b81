"""The one in-memory shape of a timed interval that every deeptrace analysis works on.

Both inputs become Spans: the collector's own trace files (`deeptrace.collect`) and PyTorch profiler (Kineto)
traces. Analyses never look at the input format, only at Spans, so one analysis serves both.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Category(StrEnum):
    COMPUTE = "compute"
    COMM = "comm"
    MEMORY = "memory"  # memory copies and sets
    SYNC = "sync"  # device/stream synchronisation, waits
    DATA = "data"  # data loading
    OPTIMIZER = "optimizer"
    CHECKPOINT = "checkpoint"
    OTHER = "other"  # seen but not classified: counted and reported, never silently dropped


@dataclass(frozen=True, slots=True)
class Span:
    """One interval on one rank.

    Times are integer nanoseconds on the rank's own clock (the collector's monotonic clock, or the Kineto trace's
    clock); `deeptrace.rundir.ClockRef` relates it to wall time, and the clock-offset analysis to other ranks.
    Spans on the same `track` (a GPU stream, a CPU thread) do not overlap one another.
    """

    name: str
    category: Category
    start_ns: int
    end_ns: int
    track: str = "main"
    step: int | None = None
    layer: int | None = None
    nbytes: int | None = None
    group: str | None = None  # process group of a collective
    seq: int | None = None  # per-group sequence number of a collective: matches it across ranks

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns
