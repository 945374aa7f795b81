"""Straggler verdict: which rank the others wait for, separated from the ranks that merely wait.

A rank is the culprit when it arrives last at clearly more collectives than chance would give it (more than
halfway between a fair share 1/N and always) and, when last, starts a meaningful time after the others
(mean lateness above a threshold). Everyone else waits, and the report says how long. Recurrence: in how many of
the steps with matched collectives the culprit caused the most waiting.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from deeptrace.analysis.collectives import SkewResult
from deeptrace.analysis.table import NO_STEP

NS_PER_MS = 1e6


class StragglerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    min_last_share: float | None = Field(
        default=None, description="share of collectives arrived last at; None: halfway between 1/N and 1"
    )
    min_lateness_ms: float = Field(default=0.1, description="mean start lateness when last, in ms")
    min_collectives: int = Field(default=3, description="fewer matched collectives give no verdict")


def straggler_verdict(skew: SkewResult, config: StragglerConfig | None = None) -> dict[str, Any]:
    """The `stragglers` section of report.json."""
    config = config or StragglerConfig()
    ranks = sorted(skew.per_rank)
    n_matched = len(skew.skew_ns)
    base: dict[str, Any] = {
        "verdict": "none",
        "culprits": [],
        "waiting_ranks": [],
        "matched_collectives": n_matched,
        "explanation": "",
    }
    if len(ranks) < 2 or n_matched < config.min_collectives:
        base["verdict"] = "unknown"
        base["explanation"] = (
            f"{n_matched} collectives matched across {len(ranks)} ranks: too few to tell a straggler "
            f"(needs {config.min_collectives} on 2 or more ranks)"
        )
        return base
    threshold = config.min_last_share if config.min_last_share is not None else 0.5 + 0.5 / len(ranks)
    steps_with_waiting = {s: c for s, c in skew.caused_by_step.items() if s != NO_STEP and c and max(c.values()) > 0}
    culprits: list[dict[str, Any]] = []
    for rank in ranks:
        a = skew.per_rank[rank]
        mean_lateness_ms = float(np.mean(a.lateness_ns)) / NS_PER_MS if a.lateness_ns else 0.0
        if a.last_share < threshold or mean_lateness_ms < config.min_lateness_ms:
            continue
        worst_in = [s for s, c in steps_with_waiting.items() if max(c, key=lambda r: c[r]) == rank]
        culprits.append(
            {
                "rank": rank,
                "last_arrival_share": round(a.last_share, 4),
                "arrived_last": a.last,
                "collectives": a.collectives,
                "mean_lateness_ms": round(mean_lateness_ms, 4),
                "caused_wait_ms": round(a.caused_wait_ns / NS_PER_MS, 4),
                "steps_recurring": len(worst_in),
                "steps_total": len(steps_with_waiting),
                "evidence": (
                    f"rank {rank} arrived last at {a.last} of {a.collectives} collectives ({100 * a.last_share:.0f}%),"
                    f" on average {mean_lateness_ms:.3f} ms after the others; the other ranks waited"
                    f" {a.caused_wait_ns / NS_PER_MS:.3f} ms in total for it; it caused the most waiting in"
                    f" {len(worst_in)} of {len(steps_with_waiting)} steps"
                ),
            }
        )
    culprit_ranks = {c["rank"] for c in culprits}
    waiting: list[dict[str, Any]] = [
        {"rank": r, "waited_ms": round(skew.per_rank[r].waited_ns / NS_PER_MS, 4)}
        for r in ranks
        if r not in culprit_ranks
    ]
    waiting.sort(key=lambda w: -w["waited_ms"])
    base["culprits"] = culprits
    base["waiting_ranks"] = waiting if culprits else []
    if culprits:
        base["verdict"] = "straggler"
        base["explanation"] = "; ".join(c["evidence"] for c in culprits) + (
            f"; ranks {', '.join(str(w['rank']) for w in waiting)} only wait for it" if waiting else ""
        )
    else:
        base["explanation"] = (
            f"no rank arrives last at more than {100 * threshold:.0f}% of the {n_matched} matched collectives"
            f" with a mean lateness above {config.min_lateness_ms} ms"
        )
    return base
