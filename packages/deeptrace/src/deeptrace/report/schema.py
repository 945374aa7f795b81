"""report.json: the analysis as one versioned, typed object (`report.model.Report`; fields in docs/deeptrace.md).

Bump SCHEMA_VERSION (in report/model.py) when a field changes meaning or disappears; adding fields keeps it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np

from deeptrace import __version__
from deeptrace.analysis.breakdown import WindowBreakdown
from deeptrace.analysis.rank import RankResult
from deeptrace.analysis.run import RunAnalysis
from deeptrace.report.model import SCHEMA, SCHEMA_VERSION, Report

NS_PER_MS = 1e6
PER_COLLECTIVE_CAP = 2000
PARTS = ("compute", "exposed_comm", "memory", "other", "idle")


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(float(value), digits)


def _window(b: WindowBreakdown) -> dict[str, Any]:
    out: dict[str, Any] = {k: (_round(v) if isinstance(v, float) else v) for k, v in b.to_dict().items()}
    out["overlap_pct"] = _round(b.overlap_pct, 2)
    if b.window_ms > 0:
        for part in PARTS:
            out[f"{part}_pct"] = round(100.0 * getattr(b, f"{part}_ms") / b.window_ms, 2)
    return out


def _kinds(result: RankResult, purposes: bool) -> dict[str, Any]:
    """report.json's collective_kinds (or collective_purposes) of one rank."""
    kinds = result.kinds
    if kinds is None:
        return {}
    step_ms = [s.window_ms for s in result.breakdown.steps]
    mean_step_ms = float(np.mean(step_ms)) if step_ms else 0.0
    out: dict[str, Any] = {}
    for kind, fig in (kinds.purposes if purposes else kinds.kinds).items():
        per_step = kinds.exposed_ns_per_step(kind, purposes)
        per_step_ms = None if per_step is None else per_step / NS_PER_MS
        out[kind] = {
            "count": fig.count,
            "bytes": fig.nbytes if fig.nbytes >= 0 else None,
            "total_ms": round(fig.total_ns / NS_PER_MS, 4),
            "exposed_ms": round(fig.exposed_ns / NS_PER_MS, 4),
            "exposed_ms_per_step": _round(per_step_ms),
            "exposed_pct_of_step": (
                round(100.0 * per_step_ms / mean_step_ms, 2) if per_step_ms is not None and mean_step_ms > 0 else None
            ),
        }
    return out


def build_report(analysis: RunAnalysis) -> Report:
    """The typed report; `.to_json()` is report.json. Built as the JSON object, then validated into the model,
    so what is written and what the renderers read cannot drift apart."""
    return Report.model_validate(_report_object(analysis))


def _report_object(analysis: RunAnalysis) -> dict[str, Any]:
    ranks: dict[str, Any] = {}
    for rank, result in analysis.ranks.items():
        has_comm = result.has_comm
        overall = _window(result.breakdown.overall)
        overall.pop("step")
        arrival = analysis.skew.per_rank.get(rank)
        ranks[str(rank)] = {
            "source": result.source,
            "path": result.path,
            "timing": result.timing,
            "timing_note": result.timing_note,
            "overlap_pct": _round(result.breakdown.overall.overlap_pct, 2) if has_comm else None,
            "exposed_comm_ms_per_step": _round(result.breakdown.exposed_comm_ms_per_step) if has_comm else None,
            "breakdown": overall,
            "steps": [_window(s) for s in result.breakdown.steps],
            "kernels": result.kernel_counts,
            "unclassified_kernels": result.unclassified,
            "clock_offset_ms": round(analysis.offsets_ns.get(rank, 0) / NS_PER_MS, 6),
            "collectives": {
                "count": len(result.collectives),
                "matched": arrival.collectives if arrival else 0,
                "arrived_last": arrival.last if arrival else 0,
                "last_arrival_share": round(arrival.last_share, 4) if arrival else None,
                "caused_wait_ms": round(arrival.caused_wait_ns / NS_PER_MS, 4) if arrival else 0.0,
                "waited_ms": round(arrival.waited_ns / NS_PER_MS, 4) if arrival else 0.0,
            },
            "collective_kinds": _kinds(result, purposes=False),
            "collective_purposes": _kinds(result, purposes=True),
        }
    skew_ms = np.asarray(analysis.skew.skew_ns, dtype=np.float64) / NS_PER_MS
    worst: list[int] = np.argsort(-skew_ms, kind="stable")[:10].tolist() if skew_ms.size else []
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "deeptrace_version": __version__,
        "created": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "run_dir": str(analysis.inputs.run_dir),
        "inputs": analysis.input_status,
        "earlier_attempts": [
            {"rank": rank, "attempt": attempt, "path": str(path)}
            for rank, attempts in analysis.inputs.earlier_attempts.items()
            for attempt, path in attempts.items()
        ],
        "ranks": ranks,
        "collectives": {
            "matched": int(skew_ms.size),
            "matched_by": analysis.matched_by,
            "skew_ms": {
                "median": _round(float(np.median(skew_ms))) if skew_ms.size else None,
                "p95": _round(float(np.percentile(skew_ms, 95))) if skew_ms.size else None,
                "max": _round(float(skew_ms.max())) if skew_ms.size else None,
            },
            # Every matched collective in time order (capped: report.json stays small on long runs).
            "per_collective": [
                {
                    "skew_ms": _round(float(skew_ms[i])),
                    "last_rank": analysis.skew.last_rank[i],
                    **analysis.skew.labels[i],
                }
                for i in range(min(skew_ms.size, PER_COLLECTIVE_CAP))
            ],
            "per_collective_truncated": bool(skew_ms.size > PER_COLLECTIVE_CAP),
            "worst": [
                {
                    "skew_ms": _round(float(skew_ms[i])),
                    "last_rank": analysis.skew.last_rank[i],
                    **analysis.skew.labels[i],
                }
                for i in worst
            ],
        },
        "clock": {
            "applied": analysis.clock_sync,
            "reference_rank": min(analysis.ranks) if analysis.ranks else None,
            "method": "median difference of collective end times (matched collectives)",
            "offsets_ms": {str(r): round(o / NS_PER_MS, 6) for r, o in analysis.offsets_ns.items()},
        },
        "stragglers": analysis.stragglers,
        "hang": analysis.hang,
        "flight_recorder": analysis.flight_recorder,
        "warnings": analysis.warnings,
    }
