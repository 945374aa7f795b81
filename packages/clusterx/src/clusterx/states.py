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

# Order of the live states: a poll may only move a job forward, so a stale answer
# (say, QUEUED arriving after RUNNING was recorded) never moves it back.
_LIVE_ORDER = {JobState.PENDING: 0, JobState.QUEUED: 1, JobState.STARTING: 2, JobState.RUNNING: 3}


def may_transition(current: JobState, new: JobState) -> bool:
    """True when a job in `current` may be moved to `new`."""
    if current.is_terminal:
        return False
    if new.is_terminal:
        return True
    return _LIVE_ORDER[new] > _LIVE_ORDER[current]
