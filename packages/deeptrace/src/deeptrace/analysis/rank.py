"""Everything computed from ONE rank's input, in a worker process: parse → table → small summary.

What comes back to the parent is small (breakdowns, the rank's collectives, counts, a coarse timeline for the
picture, and only with --merge the rank's intervals), so the parent's memory does not grow with trace size.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from deeptrace.analysis import intervals as iv
from deeptrace.analysis.breakdown import RankBreakdown, rank_breakdown
from deeptrace.analysis.collectives import CollectiveLog, collective_log
from deeptrace.analysis.kinds import RankKinds, rank_kinds
from deeptrace.analysis.nesting import exclusive_nesting
from deeptrace.analysis.table import CATEGORIES, CODE, RankTable, table_from_spans
from deeptrace.classify import ClassifyConfig, KernelClassifier
from deeptrace.collect import STEP_SPAN_NAME, STEP_TRACK, read_trace
from deeptrace.errors import TraceInputError
from deeptrace.kineto import read_kineto
from deeptrace.spans import Category

TIMELINE_PIXELS = 4000  # intervals closer than 1/TIMELINE_PIXELS of the window are joined for drawing


@dataclass
class Timeline:
    """Merged compute and communication intervals of the first complete step (wall ns), coarsened for a picture."""

    step: int | None
    compute: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]
    comm: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]


@dataclass
class MergeRows:
    """A rank's intervals for the merged Perfetto trace (only built with --merge)."""

    start_ns: npt.NDArray[np.int64]
    end_ns: npt.NDArray[np.int64]
    category: npt.NDArray[np.int8]
    track: npt.NDArray[np.int32]
    name_id: npt.NDArray[np.int32]
    tracks: list[str]
    names: list[str]


@dataclass
class RankResult:
    rank: int
    source: str
    path: str
    world_size: int | None
    breakdown: RankBreakdown
    kernel_counts: dict[str, int]
    unclassified: dict[str, int]
    collectives: CollectiveLog
    timeline: Timeline
    warnings: list[str] = field(default_factory=list)
    merge_rows: MergeRows | None = None
    timing: str = "gpu"  # RankTable.timing
    timing_note: str | None = None
    kinds: RankKinds | None = None  # exposure per kind of collective (analysis/kinds.py)
    cut: str | None = None  # RankTable.cut: the file was cut off mid-record

    @property
    def has_comm(self) -> bool:
        return self.kernel_counts.get(Category.COMM.value, 0) > 0


@dataclass(frozen=True)
class RankJob:
    """One input file to analyse; `kind` is "kineto" or "collector"."""

    path: str
    kind: str
    classify: ClassifyConfig
    keep_rows: bool = False


def load_table(job: RankJob) -> RankTable:
    path = Path(job.path)
    if job.kind == "kineto":
        return read_kineto(path, KernelClassifier(job.classify))
    reader = read_trace(path)
    warnings: list[str] = []
    offset = 0
    if reader.clock is not None:
        offset = reader.clock.start.wall_ns - reader.clock.start.mono_ns
    else:
        warnings.append(f"{path}: no clock reference ({reader.clock_error}); its times are not aligned to wall time")
    spans = (s for s in reader if not (s.name == STEP_SPAN_NAME and s.track == STEP_TRACK))
    table = exclusive_nesting(
        table_from_spans(spans, reader.rank, str(path), offset_ns=offset, world_size=reader.world_size)
    )
    if reader.torn_bytes:
        table.cut = (
            f"{path}: cut off inside its last record ({reader.torn_bytes} bytes of a record its writer never"
            f" finished: it died mid-record, or is writing it now); read the {reader.spans_read} whole spans before it"
        )
        warnings.append(table.cut)
    table.warnings.extend(warnings)
    return table


def analyse_rank(job: RankJob) -> RankResult:
    """Parse and analyse one file. Raises TraceInputError for unusable input (the caller reports it)."""
    table = load_table(job)
    if len(table) == 0:
        problem = "no GPU kernels, CPU operators or spans in the trace: nothing to analyse"
        if table.cut is not None:
            problem += f" ({table.cut.removeprefix(f'{job.path}: ')})"
        raise TraceInputError(job.path, problem)
    counts = Counter(CATEGORIES[c].value for c in table.category.tolist())
    return RankResult(
        rank=table.rank,
        source=table.source,
        path=table.path,
        world_size=table.world_size,
        breakdown=rank_breakdown(table),
        kernel_counts={c.value: counts.get(c.value, 0) for c in CATEGORIES if counts.get(c.value, 0)},
        unclassified=dict(table.unclassified.most_common(20)),
        collectives=collective_log(table),
        timeline=_timeline(table),
        warnings=list(table.warnings),
        merge_rows=_merge_rows(table) if job.keep_rows else None,
        timing=table.timing,
        timing_note=table.timing_note,
        kinds=rank_kinds(table),
        cut=table.cut,
    )


def _timeline(table: RankTable) -> Timeline:
    step = table.complete_steps[0] if table.complete_steps else None
    rows = table.step == step if step is not None else table.in_window
    start, end, cat = table.start_ns[rows], table.end_ns[rows], table.category[rows]
    window = int(end.max() - start.min()) if start.size else 0
    gap = window // TIMELINE_PIXELS

    def merged(category: Category) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        pick = cat == CODE[category]
        return iv.coarsen(iv.merge(start[pick], end[pick]), gap)

    return Timeline(step=step, compute=merged(Category.COMPUTE), comm=merged(Category.COMM))


def _merge_rows(table: RankTable) -> MergeRows:
    return MergeRows(
        start_ns=table.start_ns,
        end_ns=table.end_ns,
        category=table.category,
        track=table.track,
        name_id=table.name_id,
        tracks=table.tracks,
        names=table.names,
    )
