"""report.json objects of schema version 1, as `deeptrace analyze` writes them."""

from __future__ import annotations


def _rank(overlap: float | None, exposed: float | None, share: float | None) -> dict[str, object]:
    window = {"window_ms": 100.0, "compute_ms": 70.0, "comm_ms": 30.0, "exposed_comm_ms": 8.0, "memory_ms": 1.0,
              "other_ms": 2.0, "idle_ms": 19.0}  # fmt: skip
    return {
        "source": "collector", "path": "trace/rank-0.dtr", "timing": "spans", "timing_note": None,
        "overlap_pct": overlap, "exposed_comm_ms_per_step": exposed, "breakdown": window, "steps": [],
        "kernels": {}, "unclassified_kernels": {}, "clock_offset_ms": 0.0,
        "collectives": {"count": 9, "matched": 9, "arrived_last": 8, "last_arrival_share": share,
                        "caused_wait_ms": 9.0, "waited_ms": 0.0},
    }  # fmt: skip


def _hang() -> dict[str, object]:
    return {
        "summary": "ranks 0 wait in all_gather (dp #12) for rank 1", "now_wall_s": 0.0, "stall_after_s": 120.0,
        "world_size": 2, "stopped_ranks": [0, 1], "waiting_ranks": [0], "culprit_ranks": [1],
        "collective": {"group": "dp", "seq": 12, "name": "all_gather"}, "reason": "lower sequence number",
        "missing_ranks": [], "unreadable_ranks": {}, "evidence": [],
        "ranks": {"0": {"rank": 0, "status": "stalled", "step": 7, "in_collective": {"group": "dp", "seq": 12,
                                                                          "name": "all_gather"}},
                  "1": {"rank": 1, "status": "stalled", "step": 7, "in_collective": None, "open_span": "forward"}},
    }  # fmt: skip


def report_json(hang: bool = False, **changes: object) -> dict[str, object]:
    report: dict[str, object] = {
        "schema": "deeptrace.report", "schema_version": 1, "deeptrace_version": "0.1.0",
        "created": "2026-12-01T00:00:00Z", "run_dir": "run", "inputs": [],
        "earlier_attempts": [],
        "ranks": {"0": _rank(80.0, 1.5, 0.1), "1": _rank(None, None, 0.9)},
        "collectives": {"matched": 9, "matched_by": {"seq": 9, "order": 0},
                        "skew_ms": {"median": 1.0, "p95": 2.0, "max": 3.0}, "per_collective": [],
                        "per_collective_truncated": False, "worst": []},
        "clock": {"applied": True, "reference_rank": 0, "method": "m", "offsets_ms": {}},
        "stragglers": {"verdict": "straggler", "explanation": "rank 1 arrives last at 8 of 9 collectives",
                       "matched_collectives": 9, "waiting_ranks": [{"rank": 0, "waited_ms": 9.0}],
                       "culprits": [{"rank": 1, "last_arrival_share": 0.9, "arrived_last": 8, "collectives": 9,
                                     "mean_lateness_ms": 2.0, "caused_wait_ms": 9.0, "steps_recurring": 3,
                                     "steps_total": 3, "evidence": "last at 8/9 collectives, 2.0 ms late on average"}]},
        "hang": _hang() if hang else None,
        "warnings": ["rank 1: no communication kernel"],
    }  # fmt: skip
    report.update(changes)
    return report
