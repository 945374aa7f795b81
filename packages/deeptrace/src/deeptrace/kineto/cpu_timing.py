"""Compute, communication and waiting in a CPU-only Kineto trace (gloo backend): the rule, in one place.

A CPU trace has no kernels; the truth is in its threads. gloo runs every collective on its own worker threads
and records each as a `gloo:<collective>` annotation there, with its real start and duration, while the
training (main) thread runs the model's operators, issues the collectives (`c10d::*` operators) and blocks until
they complete. The rule (docs/deeptrace.md, "CPU-only traces"):

- **communication**: the `gloo:*` intervals, on whichever thread they are recorded;
- **main thread**: the thread of the `ProfilerStep#N` annotations (else the one with the most operator time);
- **compute**: the main thread's time inside its top-level CPU operators, less its **waiting**:
  1. time inside the collective library's own operators (`c10d::*`, `_c10d_functional::*`, e.g.
     `c10d::allreduce_`, `_c10d_functional::wait_tensor`), at any depth: issuing or waiting, not computing;
  2. from the start of such an operator to the end of the operator or annotation around it (its *scope*, e.g.
     `FSDP::post_backward_reduce (layers.1)`), the time not inside any other operator nested in that scope:
     the thread is in `Work.wait()`, which the profiler does not record as an operator. This is how FSDP2 waits
     on CPU, and the wait can sit inside a top-level operator (a backward hook of
     `autograd::engine::evaluate_function: RegisterPostBackwardFunctionBackward` blocks for the reduce-scatter).
  Time outside every operator (Python between operators, or blocking outside any operator, as FSDP2's forward
  all-gathers do inside `FSDP::all_gather (...)` annotations) is not compute either. Operators of other threads
  (the gloo threads' copies inside their collectives) belong to the collective, not to compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from deeptrace.analysis import intervals as iv
from deeptrace.kineto.cpu_events import ANNOTATION, COLLECTIVE, COLLECTIVE_OP, OP, CpuEvents

Merged = tuple[iv.I64, iv.I64]


@dataclass
class CpuTiming:
    """What a CPU trace says, on the trace's own clock (ns)."""

    main_thread: int | None  # index into CpuEvents.threads
    compute: Merged  # the main thread's compute, merged
    waiting: Merged  # the part of the top-level operators that is waiting (rules 1 and 2), merged
    collectives: npt.NDArray[np.int64]  # indices of the COLLECTIVE events, by start
    collective_threads: list[int]


def main_thread(events: CpuEvents) -> int | None:
    """The training thread: where the ProfilerStep annotations are, else the most operator time."""
    if events.step_threads:
        return events.step_threads.most_common(1)[0][0]
    collective_threads = set(events.thread[events.kind == COLLECTIVE].tolist())
    candidates = [(t, n) for t, n in events.op_time_ns.items() if t not in collective_threads]
    return max(candidates, key=lambda tn: tn[1])[0] if candidates else None


def _waiting_in_scopes(start: iv.I64, end: iv.I64, kind: npt.NDArray[np.int8]) -> Merged:
    """Rule 2 on one thread's events: after a collective operator begins, the scope's time outside other operators.

    Events of one thread nest properly; sorted by (start, longest first), an event's descendants are the run of
    events right after it that start before it ends, and its parent is the innermost open event before it.
    """
    order = np.lexsort((-(end - start), start))
    s_all, e_all, k_all = start[order], end[order], kind[order]
    s, e, k = s_all.tolist(), e_all.tolist(), k_all.tolist()
    pieces_s: list[int] = []
    pieces_e: list[int] = []
    stack: list[int] = []  # positions of the open events, outermost first
    for i in range(len(s)):
        while stack and s[i] >= e[stack[-1]]:
            stack.pop()
        parent = stack[-1] if stack else None
        stack.append(i)
        if k[i] != COLLECTIVE_OP or parent is None or k[parent] == COLLECTIVE_OP:
            continue  # the outermost collective operator of a scope only; no scope: not inside any operator
        last = int(np.searchsorted(s_all, e[parent], side="left"))  # the parent's descendants end before `last`
        inside = slice(parent + 1, last)
        ops = k_all[inside] == OP
        gap = iv.difference(
            (np.array([s[i]], np.int64), np.array([e[parent]], np.int64)),
            iv.merge(s_all[inside][ops], e_all[inside][ops]),
        )
        pieces_s.extend(gap[0].tolist())
        pieces_e.extend(gap[1].tolist())
    return iv.merge(np.asarray(pieces_s, np.int64), np.asarray(pieces_e, np.int64))


def cpu_timing(events: CpuEvents) -> CpuTiming:
    """Apply the rule of this module's docstring to one trace's CPU events."""
    collectives = np.flatnonzero(events.kind == COLLECTIVE)
    collectives = collectives[np.argsort(events.start_ns[collectives], kind="stable")]
    collective_threads = sorted(set(events.thread[collectives].tolist()))
    main = main_thread(events)
    empty: Merged = (np.empty(0, np.int64), np.empty(0, np.int64))
    if main is None:
        return CpuTiming(None, empty, empty, collectives, collective_threads)
    on_main = events.thread == main
    start, end, kind = events.start_ns[on_main], events.end_ns[on_main], events.kind[on_main]
    operators = (kind == OP) | (kind == COLLECTIVE_OP)
    busy = iv.merge(start[operators], end[operators])  # the union of the top-level operators
    not_compute = (kind == COLLECTIVE_OP) | (kind == COLLECTIVE)  # rule 1; gloo:* on the main thread blocks it
    scoped = (kind == OP) | (kind == COLLECTIVE_OP) | (kind == ANNOTATION)
    waiting = iv.union(
        iv.merge(start[not_compute], end[not_compute]),
        _waiting_in_scopes(start[scoped], end[scoped], kind[scoped]),
    )
    compute = iv.difference(busy, waiting)
    return CpuTiming(main, compute, iv.difference(busy, compute), collectives, collective_threads)
