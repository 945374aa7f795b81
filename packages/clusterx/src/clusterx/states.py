"""Canonical job states and the rule that a terminal state never changes.

Every backend maps its own states (Slurm's, the local daemon's) onto these; the backend's raw state is
kept beside the canonical one in the job record.
"""

from enum import StrEnum


class JobState(StrEnum):
    PENDING = "PENDING"  # stored, not yet accepted by a backend
    QUEUED = "QUEUED"  # accepted by a backend, waiting for resources
    STARTING = "STARTING"  # resources granted, processes starting
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"
    NODE_FAIL = "NODE_FAIL"
    LOST = "LOST"  # the backend no longer knows the job and its end was never observed

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset(
    {
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.TIMEOUT,
        JobState.PREEMPTED,
        JobState.NODE_FAIL,
        JobState.LOST,
    }
)

# The states of a job that has not ended, in the order a job goes through them: the one list every package asks
# (`clusterx cancel --all`, xtop's incremental reads). A poll may only move a job forward along it, so a stale
# answer (say, QUEUED arriving after RUNNING was recorded) never moves it back.
LIVE_STATES: tuple[JobState, ...] = (JobState.PENDING, JobState.QUEUED, JobState.STARTING, JobState.RUNNING)
_LIVE_ORDER = {state: order for order, state in enumerate(LIVE_STATES)}


def may_transition(current: JobState, new: JobState) -> bool:
    """True when a job in `current` may be moved to `new`."""
    if current.is_terminal:
        return False
    if new.is_terminal:
        return True
    return _LIVE_ORDER[new] > _LIVE_ORDER[current]
