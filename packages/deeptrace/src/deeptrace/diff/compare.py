"""Two sides → one DiffReport: per op, per collective kind and purpose, per rank, per span name.

Steps: by default each side's first step (HTA's TraceDiff compares the first profiler step of each trace), `N`
step N on both sides, `all` every step. Ops and spans are totals over the chosen steps; collectives too, over the
chosen *complete* steps (the last profiled step is cut short by the profiler); ranks are per step (mean).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

from deeptrace.analysis.breakdown import WindowBreakdown
from deeptrace.analysis.kinds import KindFigures
from deeptrace.analysis.rank import RankResult
from deeptrace.diff.model import DiffReport, KindRow, OpRow, RankRow, Side
from deeptrace.diff.side import DiffInputError, SideData

StepChoice = Literal["first", "all"] | int
NS_PER_US = 1e3


def _pick(available: Iterable[int], choice: StepChoice) -> list[int]:
    steps = sorted(available)
    if choice == "all":
        return steps
    if choice == "first":
        return steps[:1]
    return [choice] if choice in steps else []


def _sum(per_step: dict[int, dict[str, tuple[int, int]]], steps: list[int]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for step in steps:
        for name, (count, ns) in per_step.get(step, {}).items():
            c, t = out.get(name, (0, 0))
            out[name] = (c + count, t + ns)
    return out


def _rows(a: dict[str, tuple[int, int]], b: dict[str, tuple[int, int]]) -> list[OpRow]:
    rows = []
    for name in a.keys() | b.keys():
        ac, at = a.get(name, (0, 0))
        bc, bt = b.get(name, (0, 0))
        rows.append(OpRow(name=name, a_count=ac, b_count=bc, a_total_us=at / NS_PER_US, b_total_us=bt / NS_PER_US,
                          delta_us=(bt - at) / NS_PER_US))  # fmt: skip
    rows.sort(key=lambda r: (-abs(r.delta_us), -max(r.a_total_us, r.b_total_us), r.name))
    return rows


def _kind_totals(result: RankResult | None, steps: list[int], purposes: bool) -> dict[str, KindFigures]:
    out: dict[str, KindFigures] = {}
    if result is None or result.kinds is None:
        return out
    for step in steps:
        figures = result.kinds.steps.get(step)
        if figures is None:
            continue
        for kind, fig in figures[1 if purposes else 0].items():
            seen = out.get(kind)
            if seen is None:
                out[kind] = fig
                continue
            nbytes = seen.nbytes + fig.nbytes if min(seen.nbytes, fig.nbytes) >= 0 else max(seen.nbytes, fig.nbytes)
            out[kind] = KindFigures(count=seen.count + fig.count, nbytes=nbytes, total_ns=seen.total_ns + fig.total_ns,
                                    exposed_ns=seen.exposed_ns + fig.exposed_ns)  # fmt: skip
    return out


def _kind_rows(a: dict[str, KindFigures], b: dict[str, KindFigures]) -> dict[str, KindRow]:
    none = KindFigures(count=0, nbytes=-1, total_ns=0, exposed_ns=0)
    rows = {}
    for kind in a.keys() | b.keys():
        fa, fb = a.get(kind, none), b.get(kind, none)
        rows[kind] = KindRow(
            a_count=fa.count,
            b_count=fb.count,
            a_bytes=fa.nbytes if fa.nbytes >= 0 else None,
            b_bytes=fb.nbytes if fb.nbytes >= 0 else None,
            a_total_us=fa.total_ns / NS_PER_US,
            b_total_us=fb.total_ns / NS_PER_US,
            a_exposed_us=fa.exposed_ns / NS_PER_US,
            b_exposed_us=fb.exposed_ns / NS_PER_US,
            delta_exposed_us=(fb.exposed_ns - fa.exposed_ns) / NS_PER_US,
        )
    return dict(sorted(rows.items(), key=lambda kv: (-abs(kv[1].delta_exposed_us), kv[0])))


def _rank_steps(result: RankResult, choice: StepChoice) -> list[WindowBreakdown]:
    steps = {s.step: s for s in result.breakdown.steps if s.step is not None}
    if not steps:
        return result.breakdown.steps  # a trace without steps: its one window
    return [steps[s] for s in _pick(steps, choice)]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def _rank_rows(a: SideData, b: SideData, choice: StepChoice) -> list[RankRow]:
    rows = []
    for rank in sorted(a.analysis.ranks.keys() | b.analysis.ranks.keys()):
        figures: list[tuple[float | None, float | None]] = []
        for side in (a, b):
            result = side.analysis.ranks.get(rank)
            chosen = _rank_steps(result, choice) if result is not None else []
            exposed = _mean([w.exposed_comm_ms * 1e3 for w in chosen]) if result and result.has_comm else None
            figures.append((_mean([w.window_ms * 1e3 for w in chosen]), exposed))
        (a_step, a_exp), (b_step, b_exp) = figures
        rows.append(RankRow(rank=rank, a_step_us=a_step, b_step_us=b_step, a_exposed_us=a_exp, b_exposed_us=b_exp,
                            delta_step_us=_delta(a_step, b_step), delta_exposed_us=_delta(a_exp, b_exp)))  # fmt: skip
    rows.sort(key=lambda r: (r.delta_step_us is None, -abs(r.delta_step_us or 0.0), r.rank))
    return rows


def compare(a: SideData, b: SideData, choice: StepChoice, warn: Callable[[str], None]) -> DiffReport:
    """The diff of B against A; DiffInputError when a chosen step N is on neither source of a side."""
    warnings: list[str] = []

    def note(message: str) -> None:
        warnings.append(message)
        warn(message)

    sides: list[tuple[Side, dict[str, tuple[int, int]], dict[str, tuple[int, int]], list[int]]] = []
    for label, side in (("A", a), ("B", b)):
        op_steps = _pick(side.ops.steps, choice) if side.ops else []
        span_steps = _pick(side.spans, choice)
        has_source = side.ops is not None or bool(side.spans)
        if isinstance(choice, int) and has_source and not op_steps and not span_steps:
            known = sorted(set(side.ops.steps if side.ops else []) | set(side.spans))
            raise DiffInputError(f"{label} ({side.path}): no step {choice} (steps: {', '.join(map(str, known))})")
        result = side.analysis.ranks.get(side.rank) if side.rank is not None else None
        kind_steps = _pick(result.kinds.steps, choice) if result is not None and result.kinds else []
        if result is not None and result.kinds is not None and result.kinds.steps and not kind_steps:
            note(f"{label}: step {choice} is not a complete step of rank {side.rank}: no collective figures")
        shown = op_steps or span_steps
        sides.append((
            Side(path=str(side.path), rank=side.rank, steps=shown, kineto=side.ops.path if side.ops else None,
                 collector=side.collector_path),
            _sum(side.ops.steps, op_steps) if side.ops else {},
            _sum(side.spans, span_steps),
            kind_steps,
        ))  # fmt: skip
    (side_a, ops_a, spans_a, kinds_a), (side_b, ops_b, spans_b, kinds_b) = sides
    result_a = a.analysis.ranks.get(a.rank) if a.rank is not None else None
    result_b = b.analysis.ranks.get(b.rank) if b.rank is not None else None
    return DiffReport(
        step=str(choice),
        a=side_a,
        b=side_b,
        ops=_rows(ops_a, ops_b),
        collectives=_kind_rows(_kind_totals(result_a, kinds_a, False), _kind_totals(result_b, kinds_b, False)),
        purposes=_kind_rows(_kind_totals(result_a, kinds_a, True), _kind_totals(result_b, kinds_b, True)),
        ranks=_rank_rows(a, b, choice),
        spans=_rows(spans_a, spans_b),
        warnings=warnings,
    )
