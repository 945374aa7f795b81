"""A CPU-only Kineto trace (no GPU events: a gloo run on CPUs) → RankTable, by the rule of `cpu_timing`.

The table has one compute row per interval of the main thread's compute and one communication row per `gloo:*`
collective (on a track per gloo thread), so every analysis (breakdown, overlap, steps, collective matching, the
picture, the merged trace) works on it unchanged. gloo records no sequence numbers, so collectives are matched
across ranks by order: the group is the collective's name (`gloo:all_gather`), and the k-th one in a step is the
k-th on every rank (a process group runs its collectives in the order they were issued, on every rank). A
reduce-scatter, which gloo runs as an all-reduce, is named `gloo:reduce_scatter` (`backend_names`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from deeptrace.analysis import intervals as iv
from deeptrace.analysis.kinds import collective_kind
from deeptrace.analysis.table import CODE, RankTable, _Interner
from deeptrace.kineto.cpu_events import COLLECTIVE_OP, CpuEvents, read_cpu_events
from deeptrace.kineto.cpu_timing import CpuTiming, cpu_timing
from deeptrace.kineto.steps import assign_steps
from deeptrace.spans import Category

COMPUTE_ROW_NAME = "main thread compute (CPU operators)"


def _thread_label(events: CpuEvents, thread: int) -> str:
    pid, tid = events.threads[thread]
    name = events.thread_names.get((pid, tid))
    return f"cpu thread {tid}" + (f" ({name})" if name else "")


def read_cpu_table(path: Path, rank: int, offset_ns: int) -> RankTable:
    """The RankTable of a CPU-only trace; `offset_ns` turns the trace's clock into wall time."""
    events = read_cpu_events(path)
    timing = cpu_timing(events)
    tracks, names, groups = _Interner(), _Interner(), _Interner()
    comp_s, comp_e = timing.compute
    coll_s, coll_e = events.start_ns[timing.collectives], events.end_ns[timing.collectives]
    coll_names = backend_names(events, timing.collectives)
    compute_track = tracks(_thread_label(events, timing.main_thread) if timing.main_thread is not None else "main")
    coll_tracks = [tracks(_thread_label(events, int(t))) for t in events.thread[timing.collectives]]
    start = np.concatenate((comp_s, coll_s))
    end = np.concatenate((comp_e, coll_e))
    n_comp = comp_s.size
    placed = assign_steps(start, events.steps, path)
    table = RankTable(
        rank=rank,
        source="kineto",
        path=str(path),
        start_ns=start + offset_ns,
        end_ns=end + offset_ns,
        category=np.array([CODE[Category.COMPUTE]] * n_comp + [CODE[Category.COMM]] * coll_s.size, np.int8),
        track=np.array([compute_track] * n_comp + coll_tracks, np.int32),
        name_id=np.array([names(COMPUTE_ROW_NAME)] * n_comp + [names(n) for n in coll_names], np.int32),
        step=placed.step,
        group_id=np.array([-1] * n_comp + [groups(n) for n in coll_names], np.int32),
        seq=np.full(start.size, -1, np.int64),
        in_window=placed.in_window,
        tracks=tracks.values,
        names=names.values,
        groups=groups.values,
        complete_steps=placed.complete,
        warnings=placed.warnings,
        timing="cpu",
        timing_note=_how_it_was_read(events, timing),
    )
    if timing.main_thread is None:
        table.warnings.append(f"{path}: a CPU-only trace without CPU operators: no compute to report")
    return table


def backend_names(events: CpuEvents, collectives: npt.NDArray[np.int64]) -> list[str]:
    """The names of the `gloo:*` collectives at `collectives`, where gloo's own name hides what was asked for.

    gloo runs a reduce-scatter (`reduce_scatter_tensor`, FSDP2's gradient reduction) as an all-reduce: the trace
    has `c10d::_reduce_scatter_base_` on the calling thread, then `gloo:all_reduce` on a gloo thread. Each gloo
    collective is matched with the call that issued it (the calls of torch.distributed are run in the order they
    are issued: the oldest call not matched yet that began before the collective did); a `gloo:all_reduce`
    issued by a reduce-scatter call is named `gloo:reduce_scatter`, so its kind is reduce_scatter."""
    names = [events.names[int(n)] for n in events.name_id[collectives]]
    calls = np.flatnonzero(events.kind == COLLECTIVE_OP)
    calls = calls[[collective_kind(events.names[int(n)]) != "other" for n in events.name_id[calls]]]
    calls = calls[np.argsort(events.start_ns[calls], kind="stable")]
    pending = 0
    for i in np.argsort(events.start_ns[collectives], kind="stable").tolist():
        start = events.start_ns[collectives[i]]
        if pending < calls.size and events.start_ns[calls[pending]] <= start:
            issued = collective_kind(events.names[int(events.name_id[calls[pending]])])
            pending += 1
            if issued == "reduce_scatter" and collective_kind(names[i]) == "all_reduce":
                names[i] = "gloo:reduce_scatter"
    return names


def _how_it_was_read(events: CpuEvents, timing: CpuTiming) -> str:
    main = _thread_label(events, timing.main_thread) if timing.main_thread is not None else "none"
    gloo = ", ".join(_thread_label(events, t) for t in timing.collective_threads) or "none"
    return (
        f"CPU-only trace (no GPU events): communication = {timing.collectives.size} gloo collectives on {gloo};"
        f" compute = top-level CPU operators of the main thread {main}, less"
        f" {iv.total(timing.waiting) / 1e6:.2f} ms of waiting on collectives inside operators"
    )
