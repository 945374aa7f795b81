"""The per-rank table every time analysis reads: one row per interval, in compact numpy columns.

Both inputs become a RankTable: Kineto traces (GPU kernels, copies, syncs; `deeptrace.kineto.read_kineto`) and the
collector's own Spans (`table_from_spans`). Analyses only ever see this table, never the input format.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from deeptrace.spans import Category, Span

# Category ↔ small integer code in the `category` column.
CATEGORIES: tuple[Category, ...] = tuple(Category)
CODE: dict[Category, int] = {c: i for i, c in enumerate(CATEGORIES)}
NO_STEP = -1


@dataclass
class RankTable:
    """Intervals of one rank. Times are int64 nanoseconds on the rank's wall clock (`wall = t`); see `source`.

    in_window marks the rows that belong to the analysis window: for Kineto, the kernels HTA keeps (launched
    before the last ProfilerStep began, since the profiler usually stops inside the last step); all rows otherwise.
    """

    rank: int
    source: str  # "kineto" or "collector"
    path: str
    start_ns: npt.NDArray[np.int64]
    end_ns: npt.NDArray[np.int64]
    category: npt.NDArray[np.int8]
    track: npt.NDArray[np.int32]
    name_id: npt.NDArray[np.int32]
    step: npt.NDArray[np.int64]
    group_id: npt.NDArray[np.int32]
    seq: npt.NDArray[np.int64]
    in_window: npt.NDArray[np.bool_]
    tracks: list[str]
    names: list[str]
    groups: list[str]
    # Steps whose rows are complete (the last profiled step is cut short by the profiler and is left out).
    complete_steps: list[int] = field(default_factory=list)
    world_size: int | None = None
    unclassified: Counter[str] = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)
    # What the times measure: "gpu" (kernels of a Kineto trace), "cpu" (a CPU-only Kineto trace, read by
    # deeptrace.kineto.cpu_timing) or "spans" (collector spans); timing_note says how a CPU trace was read.
    timing: str = "gpu"
    timing_note: str | None = None
    # Bytes a row moved (collectives): the collector's nbytes, or the NCCL message size of a Kineto kernel;
    # -1 where unknown. None when the input never says (CPU-only traces).
    nbytes: npt.NDArray[np.int64] | None = None
    # The file was cut off (its writer died mid-record): where, and what was read of it; None for a whole file.
    cut: str | None = None

    def __len__(self) -> int:
        return int(self.start_ns.size)

    def mask(self, category: Category) -> npt.NDArray[np.bool_]:
        return np.asarray(self.category == CODE[category], dtype=np.bool_)


class _Interner:
    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.values: list[str] = []

    def __call__(self, value: str) -> int:
        found = self.ids.get(value)
        if found is None:
            found = self.ids[value] = len(self.values)
            self.values.append(value)
        return found


def table_from_spans(
    spans: Iterable[Span], rank: int, path: str, offset_ns: int = 0, world_size: int | None = None
) -> RankTable:
    """A RankTable of collector Spans; `offset_ns` turns the rank's clock into wall time (wall = t + offset)."""
    names, tracks, groups = _Interner(), _Interner(), _Interner()
    cols: dict[str, list[int]] = {k: [] for k in ("s", "e", "c", "t", "n", "st", "g", "q", "b")}
    for span in spans:
        cols["s"].append(span.start_ns + offset_ns)
        cols["e"].append(span.end_ns + offset_ns)
        cols["c"].append(CODE[span.category])
        cols["t"].append(tracks(span.track))
        cols["n"].append(names(span.name))
        cols["st"].append(NO_STEP if span.step is None else span.step)
        cols["g"].append(-1 if span.group is None else groups(span.group))
        cols["q"].append(-1 if span.seq is None else span.seq)
        cols["b"].append(-1 if span.nbytes is None else span.nbytes)
    steps = sorted({s for s in cols["st"] if s != NO_STEP})
    table = RankTable(
        rank=rank,
        source="collector",
        path=path,
        start_ns=np.asarray(cols["s"], np.int64),
        end_ns=np.asarray(cols["e"], np.int64),
        category=np.asarray(cols["c"], np.int8),
        track=np.asarray(cols["t"], np.int32),
        name_id=np.asarray(cols["n"], np.int32),
        step=np.asarray(cols["st"], np.int64),
        group_id=np.asarray(cols["g"], np.int32),
        seq=np.asarray(cols["q"], np.int64),
        in_window=np.ones(len(cols["s"]), dtype=bool),
        tracks=tracks.values,
        names=names.values,
        groups=groups.values,
        complete_steps=steps,
        world_size=world_size,
        timing="spans",
        nbytes=np.asarray(cols["b"], np.int64),
    )
    other = table.mask(Category.OTHER)
    table.unclassified.update(table.names[i] for i in table.name_id[other])
    return table
