"""Which ProfilerStep each row of a Kineto trace belongs to, and HTA's analysis window.

Shared by the GPU reading (a kernel is placed by the CPU time of its launch) and the CPU reading (a row is placed
by its own start): the rule is the same, only the time that places a row differs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from deeptrace.analysis.intervals import I64
from deeptrace.analysis.table import NO_STEP

STEP_NAME = re.compile(r"ProfilerStep\s*#\s*(\d+)")
NO_TIME = np.iinfo(np.int64).min  # a row whose placing time is unknown (a kernel without its launch)


@dataclass
class StepAssignment:
    step: npt.NDArray[np.int64]  # per row: its ProfilerStep number, or NO_STEP
    in_window: npt.NDArray[np.bool_]
    complete: list[int]
    warnings: list[str] = field(default_factory=list)


def profiler_step(name: str, start_ns: int, dur_ns: int) -> tuple[int, int, int] | None:
    """(step number, start, end) when `name` is a `ProfilerStep#N` annotation, else None."""
    found = STEP_NAME.match(name)
    return (int(found.group(1)), start_ns, start_ns + dur_ns) if found else None


def assign_steps(placed_at: I64, steps: list[tuple[int, int, int]], path: object) -> StepAssignment:
    """Steps and window of rows placed at `placed_at` (NO_TIME: not placed), as HTA does.

    A row belongs to the ProfilerStep whose window contains its placing time. With two or more steps, the window
    is the rows placed before the *last* ProfilerStep began (the profiler usually stops inside it) and the complete
    steps are those in the window except the last; with fewer, every row is in the window.
    """
    has_time = placed_at != NO_TIME
    step = np.full(placed_at.size, NO_STEP, dtype=np.int64)
    ordered = sorted(steps, key=lambda s: s[1])
    warnings: list[str] = []
    if ordered:
        starts = np.array([s[1] for s in ordered], np.int64)
        ends = np.array([s[2] for s in ordered], np.int64)
        numbers = np.array([s[0] for s in ordered], np.int64)
        idx = np.searchsorted(starts, placed_at, side="right") - 1
        inside = has_time & (idx >= 0) & (placed_at < ends[np.maximum(idx, 0)])
        step[inside] = numbers[idx[inside]]
    if len(ordered) >= 2:
        in_window = has_time & (placed_at < ordered[-1][1])
        last = ordered[-1][0]
        complete = sorted({int(s) for s in np.unique(step[in_window]) if s not in (NO_STEP, last)})
    else:
        in_window = np.ones(placed_at.size, dtype=bool)
        complete = [ordered[0][0]] if ordered else []
        if not ordered:
            warnings.append(f"{path}: no ProfilerStep#N spans: the whole trace is analysed as one step")
    return StepAssignment(step=step, in_window=in_window, complete=complete, warnings=warnings)
