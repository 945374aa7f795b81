"""Count and total time of every op (CPU operators and annotations, GPU kernels, copies) per ProfilerStep of one
Kineto trace, in one streaming pass: what `deeptrace diff` compares, and what HTA's TraceDiff counts.

The rows are HTA's: every event with a duration and a category, except the profiler's own `Trace` span. A CPU
event belongs to the ProfilerStep whose window holds its start; a GPU event (one whose args name a stream) to the
step of the CPU call with the same correlation id (its launch). That is `deeptrace.kineto.steps.assign_steps`,
the rule the analysis uses for kernels. Kept per event while reading: name id, duration, placing time (about 20
bytes); what comes back is per step and name only.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from deeptrace.analysis.table import NO_STEP, _Interner
from deeptrace.errors import TraceInputError
from deeptrace.kineto.reader import KINETO_MARKERS, _launch_times, _ns, trace_rank
from deeptrace.kineto.steps import NO_TIME, assign_steps, profiler_step
from deeptrace.kineto.stream import TraceEventStream


@dataclass
class OpTotals:
    """name → (count, total ns) for each ProfilerStep of one rank's trace."""

    rank: int
    path: str
    steps: dict[int, dict[str, tuple[int, int]]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def select(self, step: int | None) -> dict[str, tuple[int, int]]:
        """One step's totals, or (step None) every step's added up."""
        if step is not None:
            return self.steps.get(step, {})
        out: dict[str, tuple[int, int]] = {}
        for totals in self.steps.values():
            for name, (count, ns) in totals.items():
                c, t = out.get(name, (0, 0))
                out[name] = (c + count, t + ns)
        return out


class _Rows:
    def __init__(self) -> None:
        self.names = _Interner()
        self.name, self.dur, self.placed, self.corr = array("i"), array("q"), array("q"), array("q")
        self.gpu = array("b")
        self.steps: list[tuple[int, int, int]] = []

    def add(self, event: dict[str, Any]) -> None:
        cat = event.get("cat")
        if cat is None or cat == "Trace" or event.get("dur") is None:
            return
        name = str(event.get("name", ""))
        args = event.get("args")
        args = args if isinstance(args, dict) else {}
        start, dur = _ns(event["ts"]), _ns(event["dur"])
        correlation = args.get("correlation")
        on_gpu = "stream" in args
        self.name.append(self.names(name))
        self.dur.append(dur)
        self.gpu.append(on_gpu)
        self.corr.append(correlation if isinstance(correlation, int) else -1)
        self.placed.append(NO_TIME if on_gpu else start)
        if not on_gpu and name.startswith("ProfilerStep"):
            step = profiler_step(name, start, dur)
            if step is not None:
                self.steps.append(step)


def read_op_totals(path: Path) -> OpTotals:
    """Per step and name, count and total duration of one Kineto trace; TraceInputError if it is not one."""
    stream = TraceEventStream(path)
    rows = _Rows()
    try:
        for event in stream.events():
            if type(event) is dict:
                rows.add(event)
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, TraceInputError):
            raise
        raise TraceInputError(
            path, f"event {stream.events_read + 1} lacks a valid {err} (not a Kineto trace?)"
        ) from None
    if not stream.has_trace_events or not any(m in stream.metadata for m in KINETO_MARKERS):
        raise TraceInputError(path, "not a PyTorch profiler (Kineto) trace")
    rank, _, warnings = trace_rank(stream.metadata, path)
    gpu = np.frombuffer(rows.gpu, np.int8).astype(bool)
    corr = np.frombuffer(rows.corr, np.int64)
    placed = np.frombuffer(rows.placed, np.int64).copy()
    launches = ~gpu & (corr >= 0)
    placed[gpu] = _launch_times(corr[gpu], corr[launches], placed[launches])
    step = assign_steps(placed, rows.steps, path).step
    name = np.frombuffer(rows.name, np.int32)
    dur = np.frombuffer(rows.dur, np.int64)
    totals = OpTotals(rank=rank, path=str(path), warnings=warnings)
    if not rows.steps:
        totals.warnings.append(f"{path}: no ProfilerStep#N spans: no op falls in a step")
    for number in np.unique(step[step != NO_STEP]).tolist():
        pick = step == number
        ids = name[pick]
        counts = np.bincount(ids, minlength=len(rows.names.values))
        sums = np.bincount(ids, weights=dur[pick], minlength=len(rows.names.values))
        totals.steps[int(number)] = {
            rows.names.values[i]: (int(counts[i]), int(sums[i] + 0.5)) for i in np.flatnonzero(counts).tolist()
        }
    return totals
