"""Per-rank, per-step time breakdown and communication/compute overlap (sweep line over merged intervals).

Definitions (the same as HTA's, so the numbers compare; docs/deeptrace.md has the details):

- overlap_pct: of the time during which at least one communication kernel runs, the percentage during which at
  least one compute kernel runs too. Communication and compute kernels are each merged (union over all
  streams) first; memory copies and syncs count as neither. Over the whole analysis window, like HTA's
  `get_comm_comp_overlap`, not as a mean of per-step values.
- breakdown of a window (from the first kernel's start to the last kernel's end) into disjoint parts, in
  priority order: compute (any compute kernel runs), exposed communication (communication, no compute),
  memory (copies/sets only), other (sync or unclassified only), idle (nothing runs). They add up to the window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from deeptrace.analysis import intervals as iv
from deeptrace.analysis.table import CODE, RankTable
from deeptrace.spans import Category

NS_PER_MS = 1e6


@dataclass(frozen=True)
class WindowBreakdown:
    """Times in ms of one window (a step, or the whole analysis window); overlap_pct None without communication."""

    step: int | None
    window_ms: float
    compute_ms: float
    comm_ms: float
    exposed_comm_ms: float
    memory_ms: float
    other_ms: float
    idle_ms: float
    overlap_pct: float | None

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "step": self.step,
            "window_ms": self.window_ms,
            "compute_ms": self.compute_ms,
            "comm_ms": self.comm_ms,
            "exposed_comm_ms": self.exposed_comm_ms,
            "memory_ms": self.memory_ms,
            "other_ms": self.other_ms,
            "idle_ms": self.idle_ms,
            "overlap_pct": self.overlap_pct,
        }


def breakdown(table: RankTable, rows: npt.NDArray[np.bool_], step: int | None = None) -> WindowBreakdown:
    """Breakdown of the selected rows of one rank's table."""
    start, end, cat = table.start_ns[rows], table.end_ns[rows], table.category[rows]

    def merged(category: Category) -> tuple[iv.I64, iv.I64]:
        pick = cat == CODE[category]
        return iv.merge(start[pick], end[pick])

    compute = merged(Category.COMPUTE)
    comm = merged(Category.COMM)
    memory = merged(Category.MEMORY)
    busy = iv.merge(start, end)
    window = int(end.max() - start.min()) if start.size else 0
    both = iv.intersection(comm, compute)
    comm_total = iv.total(comm)
    with_memory = iv.total(iv.union(compute, comm, memory))
    compute_total = iv.total(compute)
    exposed = comm_total - both
    memory_only = with_memory - compute_total - exposed
    busy_total = iv.total(busy)
    return WindowBreakdown(
        step=step,
        window_ms=window / NS_PER_MS,
        compute_ms=compute_total / NS_PER_MS,
        comm_ms=comm_total / NS_PER_MS,
        exposed_comm_ms=exposed / NS_PER_MS,
        memory_ms=memory_only / NS_PER_MS,
        other_ms=(busy_total - with_memory) / NS_PER_MS,
        idle_ms=(window - busy_total) / NS_PER_MS,
        overlap_pct=100.0 * both / comm_total if comm_total > 0 else None,
    )


@dataclass(frozen=True)
class RankBreakdown:
    overall: WindowBreakdown  # the analysis window
    steps: list[WindowBreakdown]  # each complete step (or one entry for the whole trace without steps)

    @property
    def exposed_comm_ms_per_step(self) -> float | None:
        if not self.steps:
            return None
        return float(np.mean([s.exposed_comm_ms for s in self.steps]))


def rank_breakdown(table: RankTable) -> RankBreakdown:
    """Overall and per-step breakdown of one rank."""
    overall = breakdown(table, table.in_window)
    if table.complete_steps:
        steps = [breakdown(table, table.step == s, step=s) for s in table.complete_steps if (table.step == s).any()]
    else:
        steps = [overall]
    return RankBreakdown(overall=overall, steps=steps)
