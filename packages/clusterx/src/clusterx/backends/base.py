"""The interface every scheduler backend implements (local daemon, Slurm, and a fake for tests).

The client stores a job first (PENDING), then hands it to a backend. Backends never touch the database:
they turn a job into a backend request, report what they see, and cancel. The client maps what they report
into the job record through `clusterx.states.may_transition`, so a stale poll never moves a job back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from clusterx.states import JobState

if TYPE_CHECKING:
    from clusterx.spec import JobSpec


@dataclass(frozen=True)
class SubmitRequest:
    """What a backend needs to run one attempt of a job."""

    job_id: int
    attempt: int  # 1 for the first run; told to the job (CLUSTERX_ATTEMPT) so that training resumes
    spec_json: str  # the validated JobSpec, as JSON (clusterx.spec.JobSpec.model_validate_json)
    log_dir: Path  # where stdout/stderr files of this attempt go


@dataclass(frozen=True)
class BackendStatus:
    """One observation of a job by its backend."""

    backend_job_id: str
    state: JobState
    raw_state: str  # the backend's own word for it (e.g. Slurm's "OUT_OF_MEMORY")
    exit_code: int | None = None
    reason: str | None = None  # failure reason, e.g. "killed by signal 9 (SIGKILL)"
    hosts: tuple[str, ...] = ()
    rank_to_host: Mapping[int, str] = field(default_factory=dict)
    started_at: datetime | None = None
    ended_at: datetime | None = None
    # How many times the backend requeued the job itself (Slurm's restart count): its run number, from 0.
    # None when the backend does not say.
    restarts: int | None = None


class Backend(Protocol):
    name: str  # its key in clusterx.backends.registry.BACKENDS, where its capabilities are

    def check(self, spec: JobSpec) -> None:
        """Refuse, with a SpecError or ResourceError, a spec this backend can never run (before it is stored)."""
        ...

    def dryrun(self, request: SubmitRequest) -> str:
        """The exact request that `submit` would send (for Slurm, the sbatch script); sends nothing."""
        ...

    def submit(self, request: SubmitRequest) -> str:
        """Send the job to the backend; returns the backend's job id."""
        ...

    def poll(self, backend_job_ids: Sequence[str]) -> dict[str, BackendStatus]:
        """Status of many jobs in one call.

        An id the backend cannot find anywhere is either left out (the client marks it LOST after a grace period)
        or reported as LOST with the reason (Slurm, which also searches its accounting and exit-code files).
        Raises BackendError when the backend cannot be asked at all; the client then keeps the jobs as last seen.
        """
        ...

    def cancel(self, backend_job_id: str) -> None:
        """Cancel a job; cancelling a finished or unknown job is not an error."""
        ...

    def log_paths(self, request: SubmitRequest) -> dict[str, Path]:
        """Where the job's output goes: keys 'stdout' and 'stderr' (and 'rank-R' where per-rank files exist)."""
        ...
