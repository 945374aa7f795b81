"""One side of `deeptrace diff`: a run directory or a folder of Kineto traces, read with deeptrace's own readers.

- ops: the chosen rank's Kineto trace, per ProfilerStep (`diff.ops`);
- spans: the chosen rank's collector trace, per optimizer step;
- collectives per kind and each rank's step time and exposed communication: `deeptrace analyze`'s engine
  (`analysis.run.analyse_run`), so diff and analyze can never disagree on a figure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from deeptrace.analysis.inputs import discover_inputs
from deeptrace.analysis.run import RunAnalysis, analyse_run
from deeptrace.analysis.table import NO_STEP
from deeptrace.collect import read_trace
from deeptrace.diff.ops import OpTotals, read_op_totals
from deeptrace.errors import TraceInputError
from deeptrace.kineto.reader import rank_from_file_name


class DiffInputError(ValueError):
    """A side cannot be compared (nothing readable, no such rank or step); the message says which and why."""


@dataclass
class SideData:
    path: Path
    analysis: RunAnalysis
    rank: int | None
    ops: OpTotals | None = None
    spans: dict[int, dict[str, tuple[int, int]]] = field(default_factory=dict)  # step → name → (count, ns)
    collector_path: str | None = None


def _span_totals(path: Path) -> dict[int, dict[str, tuple[int, int]]]:
    """Per step and span name, count and total duration of a collector trace (streamed, one span at a time)."""
    out: dict[int, dict[str, tuple[int, int]]] = {}
    for span in read_trace(path):
        per_name = out.setdefault(NO_STEP if span.step is None else span.step, {})
        count, ns = per_name.get(span.name, (0, 0))
        per_name[span.name] = (count + 1, ns + span.duration_ns)
    return out


def _kineto_of_rank(paths: list[Path], rank: int | None, warn: Callable[[str], None]) -> OpTotals | None:
    """The op totals of `rank` (None: the lowest rank, as HTA's TraceDiff). Files whose name gives the rank are
    tried first, so only one large trace is read where the names are the usual rank-N."""
    named = {p: rank_from_file_name(p) for p in paths}
    if rank is None and all(r is not None for r in named.values()):
        rank = min(r for r in named.values() if r is not None)
    ordered = sorted(paths, key=lambda p: (named[p] != rank, str(p)))
    found: list[OpTotals] = []
    for path in ordered:
        try:
            totals = read_op_totals(path)
        except TraceInputError as err:
            warn(str(err))
            continue
        if rank is not None and totals.rank == rank:
            return totals
        found.append(totals)
    if rank is None and found:
        return min(found, key=lambda t: t.rank)
    return None


def load_side(path: Path, rank: int | None, jobs: int | None, warn: Callable[[str], None]) -> SideData:
    """Read one side; DiffInputError when nothing of it can be compared."""
    try:
        inputs = discover_inputs(path)
    except ValueError as err:
        raise DiffInputError(str(err)) from None
    analysis = analyse_run(path, jobs=jobs, warn=warn)
    if not analysis.ranks:
        raise DiffInputError(f"{path}: no trace could be read (see the warnings above)")
    chosen = rank if rank is not None else min(analysis.ranks)
    if rank is not None and rank not in analysis.ranks:
        raise DiffInputError(f"{path}: no rank {rank} (ranks: {_ranges(sorted(analysis.ranks))})")
    side = SideData(path=path, analysis=analysis, rank=chosen)
    if inputs.kineto:
        side.ops = _kineto_of_rank(inputs.kineto, chosen, warn)
        for message in side.ops.warnings if side.ops else []:
            warn(message)
    collector = analysis.collector_ranks.get(chosen)
    if collector is not None:
        side.collector_path = collector.path
        side.spans = _span_totals(Path(collector.path))
    return side


def _ranges(values: list[int]) -> str:
    shown = ", ".join(str(v) for v in values[:8])
    return shown + (f", … ({len(values)} ranks)" if len(values) > 8 else "")
