"""Settings of the Slurm backend: backend-wide ones (constructor) and per-job ones (JobSpec.backend_options).

Both come as string maps (a CLI's `--backend-option key=value`); per-job values override backend-wide ones.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clusterx.errors import SpecError

Launcher = Literal["auto", "torchrun", "srun"]
Accounting = Literal["auto", "sacct", "jobcomp", "none"]


def default_state_dir() -> Path:
    """Where batch scripts leave their status files: must be on a file system the compute nodes share."""
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "clusterx" / "slurm"


class SlurmOptions(BaseModel):
    """Every key the Slurm backend understands; an unknown key is an error naming the known ones."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    launcher: Launcher = Field(
        default="auto",
        description="torchrun: one task per node runs torchrun with a rendezvous from SLURM_*; srun: "
        "procs_per_node tasks per node run the command; auto: torchrun when the command's program is torchrun",
    )
    torchrun: str = Field(default="torchrun", description="torchrun program used when launcher=torchrun")
    slurm_conf: str | None = Field(default=None, description="SLURM_CONF for the Slurm commands")
    bin_dir: str | None = Field(default=None, description="folder of sbatch/squeue/sacct/scancel; PATH when unset")
    state_dir: str | None = Field(default=None, description="folder for the scripts' exit-code files (shared FS)")
    accounting: Accounting = Field(
        default="auto",
        description="where finished jobs are looked up: sacct (slurmdbd), jobcomp (sacct -c), none (exit files "
        "only); auto tries them in that order",
    )
    account: str | None = Field(default=None, description="sbatch --account")
    qos: str | None = Field(default=None, description="sbatch --qos")
    constraint: str | None = Field(default=None, description="sbatch --constraint")
    command_timeout: float = Field(default=60.0, gt=0, description="seconds one Slurm command may take")

    @classmethod
    def from_maps(cls, *maps: Mapping[str, str] | None) -> SlurmOptions:
        merged: dict[str, str] = {}
        for mapping in maps:
            merged.update(mapping or {})
        try:
            return cls.model_validate(merged)
        except ValidationError as exc:
            problems = []
            for error in exc.errors():
                key = ".".join(str(part) for part in error["loc"])
                if error["type"] == "extra_forbidden":
                    problems.append(f"unknown Slurm backend option {key!r} (known: {', '.join(cls.model_fields)})")
                else:
                    problems.append(f"Slurm backend option {key!r}: {error['msg']}")
            raise SpecError("; ".join(problems)) from None

    def resolved_state_dir(self) -> Path:
        return Path(self.state_dir) if self.state_dir else default_state_dir()
