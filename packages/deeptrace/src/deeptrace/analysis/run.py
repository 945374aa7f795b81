"""`deeptrace analyze`'s engine: per-rank analyses in parallel processes, then the cross-rank ones.

Per rank (in a worker process each): parse → RankTable → breakdown, overlap, the rank's collectives.
Across ranks (in the parent, on the small per-rank summaries): collective matching, clock offsets, arrival skew,
the straggler verdict, missing ranks; and the hang diagnosis from heartbeats.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deeptrace.analysis.clock import estimate_offsets
from deeptrace.analysis.collectives import CollectiveLog, SkewResult, match_collectives, measure_skew
from deeptrace.analysis.flight_recorder import analyse_flight_recorder
from deeptrace.analysis.inputs import Inputs, discover_inputs
from deeptrace.analysis.rank import RankJob, RankResult, analyse_rank
from deeptrace.analysis.record_files import record_files_status
from deeptrace.analysis.stragglers import StragglerConfig, straggler_verdict
from deeptrace.classify import ClassifyConfig
from deeptrace.errors import TraceInputError
from deeptrace.rundir import layout, read_meta
from deeptrace.rundir.jsonio import read_json_object
from deeptrace.spans import Category


@dataclass
class RunAnalysis:
    """Everything the reports are made of."""

    inputs: Inputs
    ranks: dict[int, RankResult]  # the result each rank's figures come from
    collector_ranks: dict[int, RankResult]
    offsets_ns: dict[int, int]
    clock_sync: bool
    skew: SkewResult
    matched_by: dict[str, int]
    stragglers: dict[str, Any]
    hang: dict[str, Any] | None
    input_status: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    flight_recorder: dict[str, Any] | None = None  # the Flight Recorder dumps' first disagreement


def _run_job(job: RankJob) -> RankResult | str:
    """Worker entry: a result, or the one-line message of a bad input (exceptions do not cross processes well)."""
    try:
        return analyse_rank(job)
    except TraceInputError as err:
        return str(err)
    except MemoryError:
        return f"{job.path}: out of memory while analysing this trace"
    except Exception as err:  # a bug, not bad input: still one line, the file named
        if os.environ.get("DEEPTRACE_DEBUG"):
            raise
        return f"{job.path}: internal error {type(err).__name__}: {err} (set DEEPTRACE_DEBUG=1 for a traceback)"


def _usable_cpus() -> int:
    """CPUs this process may run on (a container or taskset may allow fewer than the machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _run_jobs(jobs: list[RankJob], workers: int) -> list[RankResult | str]:
    if workers <= 1 or len(jobs) <= 1:
        return [_run_job(j) for j in jobs]
    # fork: workers start in milliseconds and inherit the imported modules; spawn elsewhere.
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method)) as pool:
        return list(pool.map(_run_job, jobs, chunksize=1))


def analyse_run(
    run_dir: Path,
    *,
    classify: ClassifyConfig | None = None,
    jobs: int | None = None,
    keep_rows: bool = False,
    straggler_config: StragglerConfig | None = None,
    clock_sync: bool = True,
    stall_after_s: float | None = None,
    warn: Callable[[str], None] | None = None,
) -> RunAnalysis:
    """Analyse RUN_DIR. Raises NoInputError when there is nothing to analyse; bad files become warnings."""
    inputs = discover_inputs(run_dir)
    warnings: list[str] = []

    def note(message: str) -> None:
        warnings.append(message)
        if warn is not None:
            warn(message)

    config = classify or ClassifyConfig()
    rank_jobs = [RankJob(str(p), kind, config, keep_rows) for p, kind in inputs.files]
    workers = min(jobs or _usable_cpus(), len(rank_jobs)) if rank_jobs else 1
    outcomes = _run_jobs(rank_jobs, workers)

    kineto: dict[int, RankResult] = {}
    collector: dict[int, RankResult] = {}
    status: list[dict[str, Any]] = []
    for job, outcome in zip(rank_jobs, outcomes, strict=True):
        if isinstance(outcome, str):
            note(outcome)
            status.append({"path": job.path, "kind": job.kind, "rank": None, "error": outcome})
            continue
        status.append({"path": job.path, "kind": job.kind, "rank": outcome.rank, "error": None, "cut": outcome.cut})
        for message in outcome.warnings:
            note(message)
        into = kineto if outcome.source == "kineto" else collector
        if outcome.rank in into:
            kept = into[outcome.rank].path
            note(f"{outcome.path}: a second {outcome.source} trace of rank {outcome.rank}; kept {kept}")
            continue
        into[outcome.rank] = outcome
    if inputs.is_run_dir:
        status += record_files_status(inputs.run_dir, note)
    ranks = {**collector, **kineto}  # Kineto (GPU time) wins where a rank has both
    ranks = dict(sorted(ranks.items()))

    _missing_ranks(inputs, ranks, note)
    for rank, result in ranks.items():
        if not result.has_comm:
            note(
                f"rank {rank}: no communication kernel in {result.path}, so overlap and exposed communication are"
                " not reported (rather than shown as 0%); if it communicates under other names, add patterns with"
                " --classify FILE"
            )
        if result.unclassified:
            total = result.kernel_counts.get(Category.OTHER.value, 0)
            top = ", ".join(f"{name[:60]} ×{n}" for name, n in list(result.unclassified.items())[:3])
            note(
                f"rank {rank}: {total} kernels matched no classification pattern (e.g. {top}); they count as"
                " neither compute nor communication — add patterns with --classify FILE"
            )

    logs: dict[int, CollectiveLog] = {}
    for rank in ranks:
        source = collector.get(rank) if rank in collector and len(collector[rank].collectives) else ranks[rank]
        if source is not None and len(source.collectives):
            logs[rank] = source.collectives
    matched = match_collectives(logs)
    offsets = estimate_offsets(matched) if clock_sync else {}
    skew = measure_skew(matched, offsets)
    matched_by = {"seq": sum(m.key[1] == "seq" for m in matched), "order": sum(m.key[1] == "order" for m in matched)}
    if len(logs) >= 2 and not matched:
        note("collectives of different ranks could not be matched (no shared process group and sequence numbers)")
    stragglers = straggler_verdict(skew, straggler_config)
    hang = _hang(inputs, note, stall_after_s)
    flight = analyse_flight_recorder(inputs.run_dir, note) if inputs.is_run_dir else None
    return RunAnalysis(
        flight_recorder=flight,
        inputs=inputs,
        ranks=ranks,
        collector_ranks=collector,
        offsets_ns={r: offsets.get(r, 0) for r in ranks},
        clock_sync=clock_sync,
        skew=skew,
        matched_by=matched_by,
        stragglers=stragglers,
        hang=hang,
        input_status=status,
        warnings=warnings,
    )


def _missing_ranks(inputs: Inputs, ranks: dict[int, RankResult], note: Callable[[str], None]) -> None:
    if not ranks:
        return
    world = max((r.world_size or 0 for r in ranks.values()), default=0)
    if inputs.is_run_dir:
        with contextlib.suppress(TraceInputError, ValueError, OSError):  # no meta.json: the traces' word it is
            world = max(world, read_meta(inputs.run_dir).world_size)
    found = set(ranks)
    gaps = sorted(set(range(max(found) + 1)) - found)
    if gaps:
        note(f"missing ranks {_ranges(gaps)}: no usable trace (gap in the rank numbers); analysed the others")
    if world > max(found) + 1:
        absent = _ranges(list(range(max(found) + 1, world)))
        note(
            f"traces of {len(found)} of {world} ranks (world size {world}): ranks {absent} have none;"
            " cross-rank results cover the ranks present only"
        )


def _ranges(values: list[int]) -> str:
    parts: list[str] = []
    start = prev = values[0]
    for v in values[1:]:
        if v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = v
    parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ", ".join(parts)


def _hang(inputs: Inputs, note: Callable[[str], None], stall_after_s: float | None) -> dict[str, Any] | None:
    """The hang diagnosis from heartbeats (deeptrace.analysis.hang), when the run directory has them."""
    if not layout.heartbeat_dir(inputs.run_dir).is_dir():
        return None
    try:
        # Lazy: the hang analysis is optional for folders of Kineto traces, and is another engineer's module.
        from deeptrace.analysis.hang import diagnose_hang  # noqa: PLC0415
    except ImportError as err:
        note(f"hang diagnosis unavailable in this installation ({err})")
        return None
    try:
        report = (
            diagnose_hang(inputs.run_dir)
            if stall_after_s is None
            else diagnose_hang(inputs.run_dir, stall_after_s=stall_after_s)
        )
    except (TraceInputError, ValueError) as err:
        note(f"hang diagnosis skipped: {err}")
        return None
    watched = _latest_watch_verdict(inputs.run_dir, note)
    if report is None:
        return None
    found = dict(report.to_dict())
    found["watch"] = watched
    return found


def _latest_watch_verdict(run_dir: Path, note: Callable[[str], None]) -> dict[str, Any] | None:
    """The newest verdict of `deeptrace watch` (RUN_DIR/deeptrace/hang-*/verdict.json): its culprits and where."""
    folders = layout.hang_dirs(run_dir)
    if not folders:
        return None
    path = folders[-1] / layout.VERDICT_FILE
    try:
        verdict = read_json_object(path)
    except TraceInputError as err:
        note(f"watch verdict skipped: {err}")
        return None
    return {
        "path": str(path),
        "created": verdict.get("created"),
        "summary": verdict.get("summary"),
        "culprit_ranks": verdict.get("culprit_ranks", []),
        "culprits": [
            {k: c.get(k) for k in ("rank", "where", "function", "evidence")} for c in verdict.get("culprits", [])
        ],
        "hangs_recorded": len(folders),
    }
