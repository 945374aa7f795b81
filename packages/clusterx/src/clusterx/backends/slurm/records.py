"""Parse what Slurm's commands print (squeue, sacct, sacct -c) and the batch script's status file.

Pure functions over text, so that each format is tested without a cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

# The fields asked of squeue and sacct, in the order the parsers below read them.
SQUEUE_FORMAT = "%i|%T|%r|%N|%S"
SACCT_FIELDS = "JobID,State,ExitCode,NodeList,Start,End"

_PARSABLE_ID = re.compile(r"^(\d+(?:_\d+)?)(?:;(\S+))?$")


@dataclass(frozen=True)
class SlurmRecord:
    """One job as one Slurm command reported it."""

    job_id: str
    raw_state: str
    exit_code: str = ""  # Slurm's "N:S"; empty when the source does not tell
    nodelist: str = ""
    started_at: datetime | None = None
    ended_at: datetime | None = None
    pending_reason: str | None = None  # squeue's %r for a waiting job ("Resources", "Priority", ...)


def parse_sbatch_parsable(output: str) -> tuple[str, str | None]:
    """`sbatch --parsable` prints 'JOBID' or 'JOBID;CLUSTER' → (job id, cluster or None)."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    match = _PARSABLE_ID.match(lines[-1]) if lines else None
    if not match:
        raise ValueError(f"sbatch --parsable printed {output!r}, which holds no job id")
    return match.group(1), match.group(2)


def parse_slurm_time(text: str) -> datetime | None:
    """Slurm's local 'YYYY-MM-DDTHH:MM:SS' → an aware UTC datetime; 'Unknown', 'None', 'N/A' → None."""
    text = text.strip()
    if not text or text in ("Unknown", "None", "N/A", "(null)"):
        return None
    try:
        local = datetime.fromisoformat(text)
    except ValueError:
        return None
    return local.astimezone().astimezone(UTC)  # naive times are the host's local time


def parse_squeue(output: str) -> dict[str, SlurmRecord]:
    """Lines of `squeue --noheader --format=SQUEUE_FORMAT`."""
    records: dict[str, SlurmRecord] = {}
    for line in output.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 5 or not fields[0]:
            continue
        job_id, state, reason, nodelist, start = fields[:5]
        records[job_id] = SlurmRecord(
            job_id=job_id,
            raw_state=state,
            nodelist=nodelist,
            started_at=parse_slurm_time(start),
            pending_reason=reason if reason and reason != "None" else None,
        )
    return records


def parse_sacct(output: str) -> dict[str, SlurmRecord]:
    """Lines of `sacct --parsable2 --noheader --format=SACCT_FIELDS` (also with -c, the completion log).

    Job steps ('123.batch', '123.0') are skipped; when a job appears more than once (requeued), the last
    record wins, which is the newest in both sacct's and the completion log's order.
    """
    records: dict[str, SlurmRecord] = {}
    for line in output.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 6 or not fields[0] or "." in fields[0]:
            continue
        job_id, state, exit_code, nodelist, start, end = fields[:6]
        records[job_id] = SlurmRecord(
            job_id=job_id,
            raw_state=state,
            exit_code=exit_code,
            nodelist=nodelist,
            started_at=parse_slurm_time(start),
            ended_at=parse_slurm_time(end),
        )
    return records


@dataclass(frozen=True)
class StatusFile:
    """What the batch script wrote about itself (see script.py): start, and later exit or signal."""

    started_at: datetime | None
    ended_at: datetime | None
    nodelist: str
    time_limit_s: int
    procs_per_node: int  # ranks per host, for rank → host (Slurm itself does not know torchrun's workers)
    restarts: int  # SLURM_RESTART_COUNT of the run that wrote it: 1 after Slurm requeued the job once
    exit_code: int | None  # set when the job's processes ended by themselves
    signal: str | None  # "TERM" when Slurm terminated the script (scancel, time limit, preemption)
    slurm_state: str  # squeue's %T as the script ended ("RUNNING", "COMPLETING", ...), or ""
    slurm_reason: str  # squeue's %r then ("TimeLimit", "None", ...), or ""


def _epoch(value: str | None) -> datetime | None:
    return datetime.fromtimestamp(int(value), UTC) if value and value.isdigit() else None


def parse_status_file(text: str) -> StatusFile:
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    exit_text = values.get("exit", "")
    slurm_state, _, slurm_reason = values.get("slurm", "").partition("|")
    limit_text = values.get("time_limit_s", "0")
    procs_text = values.get("procs_per_node", "1")
    return StatusFile(
        started_at=_epoch(values.get("start")),
        ended_at=_epoch(values.get("end")),
        nodelist=values.get("nodelist", ""),
        time_limit_s=int(limit_text) if limit_text.isdigit() else 0,
        procs_per_node=int(procs_text) if procs_text.isdigit() and int(procs_text) > 0 else 1,
        restarts=int(restarts_text) if (restarts_text := values.get("restarts", "0")).isdigit() else 0,
        exit_code=int(exit_text) if exit_text.isdigit() else None,
        signal=values.get("signal") or None,
        slurm_state=slurm_state,
        slurm_reason=slurm_reason,
    )


def read_status_file(path: Path) -> StatusFile | None:
    try:
        return parse_status_file(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None
