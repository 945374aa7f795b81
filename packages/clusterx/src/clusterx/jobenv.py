"""The one place a job's environment is built, for every backend: the spec's `env` (the allow-listed variables of
the submitting shell plus --env) and the CLUSTERX_* variables, the same set everywhere (docs/clusterx.md lists
them). A backend adds only what its launcher needs (the local daemon: MASTER_ADDR, WORLD_SIZE, ...; Slurm's script:
MASTER_ADDR and MASTER_PORT from the allocation)."""

from __future__ import annotations

from collections.abc import Mapping

from clusterx.environment import looks_secret
from clusterx.errors import SpecError
from clusterx.spec import JobSpec

# What every job is told about itself, whatever runs it.
CLUSTERX_VARIABLES = (
    "CLUSTERX_JOB_ID",
    "CLUSTERX_ATTEMPT",  # 1, 2, ...: a training job resumes from its checkpoints when > 1
    "CLUSTERX_RUN_DIR",
    "CLUSTERX_BACKEND",
    "CLUSTERX_NODES",
    "CLUSTERX_PROCS_PER_NODE",
)


def clusterx_variables(spec: JobSpec, *, backend: str, job_id: int, attempt: int, run_dir: str) -> dict[str, str]:
    values = (job_id, attempt, run_dir, backend, spec.nodes, spec.procs_per_node)
    return {name: str(value) for name, value in zip(CLUSTERX_VARIABLES, values, strict=True)}


def job_environment(
    spec: JobSpec,
    *,
    backend: str,
    job_id: int,
    attempt: int,
    run_dir: str,
    launcher: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Exactly what the job's processes see, besides what Slurm and torchrun set themselves: the spec's variables
    (sorted), the CLUSTERX_* ones, then `launcher`'s (the backend's rendezvous variables). `backend` is the name
    of the backend that runs it."""
    for key in spec.env:
        if looks_secret(key):  # the spec refuses these already; an environment must never carry one
            raise SpecError(f"environment variable {key} looks like a secret and is not given to a job")
    env = dict(sorted(spec.env.items()))
    env.update(clusterx_variables(spec, backend=backend, job_id=job_id, attempt=attempt, run_dir=run_dir))
    env.update(launcher or {})
    return env
