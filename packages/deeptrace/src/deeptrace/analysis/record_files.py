"""The run directory's record files as `deeptrace analyze` reads them: metrics.jsonl, ranks/rank-R.jsonl and the
heartbeats, through the run directory's typed readers.

The analyses work on traces; these files are read so that the report says what each one holds (its whole
records and last step, in report.json's `inputs`) and names each one that was cut off mid-record by a writer that
died, or that cannot be read at all, with one note each. Nothing here raises on a bad file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from deeptrace.errors import CutOffError, TraceInputError
from deeptrace.rundir import layout
from deeptrace.rundir.jsonl import LineParser, scan_records
from deeptrace.rundir.readers import rank_records_files, read_heartbeats
from deeptrace.rundir.step_records import RankStepRecord, StepRecord

# How every line of metrics.jsonl and ranks/rank-R.jsonl begins: `format_version` is the records' first field.
RECORD_START = b'{"format_version":'


def record_files_status(run_dir: Path, note: Callable[[str], None]) -> list[dict[str, Any]]:
    """report.json `inputs` entries of the record files present; a note for each cut-off or unreadable one."""
    entries: list[dict[str, Any]] = []
    if layout.metrics_path(run_dir).is_file():
        entries.append(_jsonl_status(layout.metrics_path(run_dir), "metrics", None, StepRecord.from_line, note))
    for rank, path in rank_records_files(run_dir).items():
        entries.append(_jsonl_status(path, "rank_records", rank, RankStepRecord.from_line, note))
    errors: dict[int, TraceInputError] = {}
    beats = read_heartbeats(run_dir, errors=errors)
    for rank in sorted(set(beats) | set(errors)):
        path = layout.heartbeat_path(run_dir, rank)
        if rank in errors:
            message = f"{errors[rank]}; rank {rank} has no heartbeat for the hang diagnosis"
            note(message)
            cut = message if isinstance(errors[rank], CutOffError) else None
            entries.append(_entry(path, "heartbeat", rank, error=message, cut=cut))
        else:
            entries.append(_entry(path, "heartbeat", rank, records=1, last_step=beats[rank].step))
    return entries


def _jsonl_status(
    path: Path,
    kind: str,
    rank: int | None,
    parse: LineParser[StepRecord] | LineParser[RankStepRecord],
    note: Callable[[str], None],
) -> dict[str, Any]:
    try:
        # The analyses do not need every record: count them and read the last (a long run has millions).
        scan = scan_records(path, parse, RECORD_START)
    except TraceInputError as error:
        note(str(error))
        return _entry(path, kind, rank, error=str(error))
    for cut in scan.cuts:
        note(str(cut))
    return _entry(
        path,
        kind,
        rank,
        cut="; ".join(str(cut) for cut in scan.cuts) or None,
        records=scan.records,
        last_step=scan.last.step if scan.last is not None else None,
    )


def _entry(
    path: Path,
    kind: str,
    rank: int | None,
    *,
    error: str | None = None,
    cut: str | None = None,
    records: int | None = None,
    last_step: int | None = None,
) -> dict[str, Any]:
    return {
        "path": str(path), "kind": kind, "rank": rank, "error": error, "cut": cut, "records": records,
        "last_step": last_step,
    }  # fmt: skip
