"""Readers of a run directory: each returns typed records or raises TraceInputError naming the file.

Readers never need the writer's process: they work on a live run (half-written last lines are skipped until
complete) and on the leftovers of a crashed one.
"""

from __future__ import annotations

from pathlib import Path

from deeptrace.errors import CutOffError, TraceInputError
from deeptrace.rundir import layout
from deeptrace.rundir.jsonio import check_format_version, read_json_object
from deeptrace.rundir.jsonl import RecordFollower, read_records
from deeptrace.rundir.records import Heartbeat, RankClock, RunMeta
from deeptrace.rundir.step_records import RankStepRecord, StepRecord


def read_meta(run_dir: Path | str) -> RunMeta:
    path = layout.meta_path(run_dir)
    obj = read_json_object(path)
    check_format_version(path, obj, layout.FORMAT_VERSION)
    return RunMeta.from_dict(obj, path)


def read_config_toml(run_dir: Path | str) -> str:
    path = layout.config_path(run_dir)
    try:
        return path.read_text()
    except FileNotFoundError:
        raise TraceInputError(path, "file not found") from None


def read_metrics(run_dir: Path | str, cuts: list[CutOffError] | None = None) -> list[StepRecord]:
    """metrics.jsonl, one record per optimizer step; [] when the file does not exist (yet). A file cut off
    mid-line is read up to its last whole record; pass `cuts` to learn where it was cut (`read_records`)."""
    return read_records(layout.metrics_path(run_dir), StepRecord.from_line, missing_ok=True, cuts=cuts)


def read_rank_records(run_dir: Path | str, cuts: list[CutOffError] | None = None) -> dict[int, list[RankStepRecord]]:
    """ranks/rank-{R}.jsonl of every rank that has one, keyed by rank (cut-off files: as `read_metrics`)."""
    return {
        rank: read_records(path, RankStepRecord.from_line, cuts=cuts)
        for rank, path in rank_records_files(run_dir).items()
    }


def rank_records_files(run_dir: Path | str) -> dict[int, Path]:
    """ranks/rank-{R}.jsonl by rank, of the ranks that have one (sorted by rank)."""
    folder = layout.ranks_dir(run_dir)
    found: dict[int, Path] = {}
    if folder.is_dir():
        for path in folder.glob("rank-*.jsonl"):
            rank = layout.rank_of_file(path)
            if rank is not None and path.name == f"rank-{rank}.jsonl":
                found[rank] = path
    return dict(sorted(found.items()))


def follow_metrics(run_dir: Path | str) -> RecordFollower[StepRecord]:
    """A follower of metrics.jsonl: each poll returns the step records completed since the last one."""
    return RecordFollower(layout.metrics_path(run_dir), StepRecord.from_line)


def follow_rank_records(path: Path | str) -> RecordFollower[RankStepRecord]:
    """A follower of one ranks/rank-{R}.jsonl (a path of `rank_records_files`)."""
    return RecordFollower(path, RankStepRecord.from_line)


def read_heartbeat(path: Path | str) -> Heartbeat:
    path = Path(path)
    obj = read_json_object(path)
    check_format_version(path, obj, layout.FORMAT_VERSION)
    return Heartbeat.from_dict(obj, path)


def read_heartbeats(run_dir: Path | str, errors: dict[int, TraceInputError] | None = None) -> dict[int, Heartbeat]:
    """Every rank's heartbeat, keyed by rank.

    An unreadable heartbeat (empty, half-written by a non-atomic copy, invalid) is left out; pass `errors` to
    collect why, keyed by rank. Without `errors`, the first unreadable file raises.
    """
    folder = layout.heartbeat_dir(run_dir)
    found: dict[int, Heartbeat] = {}
    if not folder.is_dir():
        return found
    for path in folder.glob("rank-*.json"):
        rank = layout.rank_of_file(path)
        if rank is None or path.name != f"rank-{rank}.json":
            continue
        try:
            found[rank] = read_heartbeat(path)
        except TraceInputError as error:
            if errors is None:
                raise
            errors[rank] = error
    return dict(sorted(found.items()))


def read_rank_clock(run_dir: Path | str, rank: int) -> RankClock:
    path = layout.clock_path(run_dir, rank)
    obj = read_json_object(path)
    check_format_version(path, obj, layout.FORMAT_VERSION)
    return RankClock.from_dict(obj, path)
