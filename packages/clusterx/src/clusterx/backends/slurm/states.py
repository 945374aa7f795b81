"""Slurm's job states and exit codes → clusterx's canonical JobState, keeping Slurm's own word.

Slurm reports states in three places (squeue, sacct, the job-completion log) with small differences:
sacct writes "CANCELLED by 1000", squeue may add a flag suffix ("COMPLETING+"), sacct abbreviates nothing
with --format=State but squeue's %t does ("CD"). `normalize_state` reduces all of them to the base word.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from clusterx.states import JobState

# Every job state Slurm 22.05–24.x documents (squeue(1) "JOB STATE CODES", sacct(1) "JOB STATE CODES"),
# plus the state flags squeue prints as states. Live states map to the non-terminal canonical ones; the
# comment says why where the choice is not obvious.
SLURM_STATE_MAP: dict[str, JobState] = {
    "PENDING": JobState.QUEUED,
    "REQUEUED": JobState.QUEUED,  # the job goes back to the queue and will run again
    "REQUEUE_FED": JobState.QUEUED,
    "REQUEUE_HOLD": JobState.QUEUED,  # requeued and held: still queued, waiting for a release
    "RESV_DEL_HOLD": JobState.QUEUED,
    "CONFIGURING": JobState.STARTING,  # nodes allocated, booting or being set up
    "POWER_UP_NODE": JobState.STARTING,
    "UPDATE_DB": JobState.STARTING,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,  # processes ended, epilog running: the exit code is not final yet
    "SUSPENDED": JobState.RUNNING,  # still holds its nodes; resumes where it stopped
    "STOPPED": JobState.RUNNING,  # SIGSTOPped but keeps its allocation
    "RESIZING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "COMPLETED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
    "LAUNCH_FAILED": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,  # a failure of the job itself (its memory request was too small)
    "SPECIAL_EXIT": JobState.FAILED,  # ended with the site's special exit code and was held
    "CANCELLED": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED,  # federation: this sibling was withdrawn because another cluster runs it
    "TIMEOUT": JobState.TIMEOUT,
    "DEADLINE": JobState.TIMEOUT,  # killed at its --deadline: a time limit by another name
    "PREEMPTED": JobState.PREEMPTED,
    "NODE_FAIL": JobState.NODE_FAIL,
    "BOOT_FAIL": JobState.NODE_FAIL,  # a node of the allocation failed to boot
}

# squeue's compact codes (%t), accepted so that a caller using them is not surprised.
SLURM_STATE_CODES: dict[str, str] = {
    "PD": "PENDING",
    "CF": "CONFIGURING",
    "R": "RUNNING",
    "CG": "COMPLETING",
    "CD": "COMPLETED",
    "F": "FAILED",
    "CA": "CANCELLED",
    "TO": "TIMEOUT",
    "PR": "PREEMPTED",
    "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY",
    "BF": "BOOT_FAIL",
    "DL": "DEADLINE",
    "S": "SUSPENDED",
    "ST": "STOPPED",
    "RQ": "REQUEUED",
    "RF": "REQUEUE_FED",
    "RH": "REQUEUE_HOLD",
    "RS": "RESIZING",
    "RV": "REVOKED",
    "SE": "SPECIAL_EXIT",
    "SI": "SIGNALING",
    "SO": "STAGE_OUT",
    "RD": "RESV_DEL_HOLD",
}

_REASONS: dict[str, str] = {
    "OUT_OF_MEMORY": "out of memory: the job used more than its --mem",
    "SPECIAL_EXIT": "ended with the special exit code and was held by Slurm",
    "LAUNCH_FAILED": "Slurm could not launch the job",
    "REVOKED": "revoked by the federation (a sibling job runs on another cluster)",
    "DEADLINE": "killed at its deadline",
    "TIMEOUT": "killed at its time limit",
    "BOOT_FAIL": "a node failed to boot",
    "NODE_FAIL": "a node of the job failed",
    "PREEMPTED": "preempted by a job of higher priority",
}

_CANCELLED_BY = re.compile(r"^CANCELLED\s+by\s+(\d+)$")


@dataclass(frozen=True)
class MappedState:
    state: JobState
    raw_state: str  # Slurm's text as reported, e.g. "CANCELLED by 0"
    reason: str | None


def normalize_state(raw: str) -> str:
    """'CANCELLED by 0' → 'CANCELLED', 'COMPLETING+' → 'COMPLETING', 'CD' → 'COMPLETED'."""
    word = raw.strip().split(" ", 1)[0].rstrip("+*~#!%$@^-").upper()
    return SLURM_STATE_CODES.get(word, word)


def map_slurm_state(raw: str) -> MappedState:
    """Canonical state of a Slurm state text; an unknown word stays live (QUEUED) and is named in the reason.

    Unknown words never end a job: a Slurm newer than this table may add a state, and a wrong terminal state
    could never be corrected (terminal states are final), whereas a live one is corrected by the next poll.
    """
    base = normalize_state(raw)
    state = SLURM_STATE_MAP.get(base)
    if state is None:
        return MappedState(JobState.QUEUED, raw.strip(), f"unknown Slurm state {raw.strip()!r}")
    reason = _REASONS.get(base)
    cancelled_by = _CANCELLED_BY.match(raw.strip())
    if cancelled_by:
        reason = f"cancelled by uid {cancelled_by.group(1)}"
    elif base == "CANCELLED":
        reason = "cancelled"
    return MappedState(state, raw.strip(), reason)


@dataclass(frozen=True)
class ExitStatus:
    exit_code: int | None  # the process's exit status; 128+N when killed by signal N (the shell's convention)
    reason: str | None  # names the signal, e.g. "killed by signal 9 (SIGKILL)"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def parse_exit_code(text: str) -> ExitStatus:
    """Slurm's 'N:S' (exit status N, terminating signal S) → ExitStatus; '' or garbage → unknown."""
    status, sep, sig = text.strip().partition(":")
    if not status.isdigit() or (sep and not sig.isdigit()):
        return ExitStatus(None, None)
    signum = int(sig) if sep else 0
    if signum:
        return ExitStatus(128 + signum, f"killed by signal {signum} ({signal_name(signum)})")
    code = int(status)
    return ExitStatus(code, None if code == 0 else f"exited with status {code}")


def combine(mapped: MappedState, exit_status: ExitStatus) -> tuple[JobState, str | None]:
    """The final state and reason from Slurm's state and exit code.

    COMPLETED always has exit 0 in Slurm; a FAILED job's reason is best told by its exit code or signal.
    """
    state = mapped.state
    if state is JobState.SUCCEEDED and exit_status.exit_code not in (None, 0):
        state = JobState.FAILED  # defensive: never report success for a non-zero exit
    if state is JobState.FAILED and mapped.reason is None:
        return state, exit_status.reason or "failed"
    if mapped.reason and exit_status.reason and state is not JobState.SUCCEEDED:
        return state, f"{mapped.reason}; {exit_status.reason}"
    return state, mapped.reason or (exit_status.reason if state is not JobState.SUCCEEDED else None)
