"""The job spec: one description of a job for every backend (local daemon, Slurm, fake).

A spec is validated once, before anything is stored; what is stored (and what `SubmitRequest.spec_json`
carries) is `JobSpec.model_dump_json()`, with memory in MiB and the time limit in seconds.

The environment a job sees is exactly `env` plus the variables its backend sets (MASTER_ADDR, CLUSTERX_JOB_ID, ...):
nothing else of the submitting shell. `env_from_shell` picks the allow-listed variables of the shell; keys that
look like secrets are refused, because the spec is written to the database and into sbatch scripts.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from clusterx.backends.registry import BACKENDS, DEFAULT_BACKEND
from clusterx.environment import ENV_KEY, env_from_shell, looks_secret, parse_env_assignment
from clusterx.errors import SpecError
from clusterx.specfile import read_spec_file

__all__ = [
    "JobSpec",
    "describe_validation_error",
    "env_from_shell",
    "looks_secret",
    "parse_duration_seconds",
    "parse_env_assignment",
    "parse_memory_mib",
]

_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_MEMORY_FACTOR_MIB = {"K": 1 / 1024, "M": 1, "": 1, "G": 1024, "T": 1024 * 1024}
_DURATION_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$", re.IGNORECASE)
_DURATION_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_memory_mib(value: str | int) -> int:
    """'16G' / '512M' / '1.5T' / 2048 (MiB) → MiB. A bare number means MiB, like Slurm's --mem."""
    if isinstance(value, int):
        return value
    match = _MEMORY.match(value)
    if not match:
        raise ValueError(f"memory {value!r} is not like '16G', '512M' or '2048' (MiB)")
    number, unit = float(match.group(1)), match.group(2).upper()
    return max(1, round(number * _MEMORY_FACTOR_MIB[unit]))


def parse_duration_seconds(value: str | int) -> int:
    """'01:30:00' / '90:00' / '1-12:00:00' / '90m' / '2h' / '45s' / 5400 (seconds) → seconds."""
    if isinstance(value, int):
        return value
    text = value.strip()
    match = _DURATION_UNIT.match(text)
    if match:
        return round(float(match.group(1)) * _DURATION_SECONDS[match.group(2).lower()])
    days = 0
    if "-" in text:
        day_text, _, text = text.partition("-")
        if not day_text.isdigit():
            raise ValueError(f"time limit {value!r}: days before '-' must be a number")
        days = int(day_text)
    parts = text.split(":")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"time limit {value!r} is not like '01:30:00', '90m', '2h' or a number of seconds")
    numbers = [int(p) for p in parts]
    while len(numbers) < 3:  # 'MM:SS' and 'SS'
        numbers.insert(0, 0)
    hours, minutes, seconds = numbers
    return days * 86400 + hours * 3600 + minutes * 60 + seconds


class JobSpec(BaseModel):
    """What to run and what it needs. Every backend reads this one model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="", description="job name; empty means the command's program name")
    command: list[str] = Field(min_length=1, description="argv of the job's program, run without a shell")
    workdir: str | None = Field(default=None, description="working directory; the submit directory when unset")
    env: dict[str, str] = Field(default_factory=dict, description="the job's whole environment (see module doc)")
    nodes: int = Field(default=1, ge=1, description="number of machines")
    procs_per_node: int = Field(default=1, ge=1, description="processes per node (one per GPU on GPU jobs)")
    gpus_per_node: int = Field(default=0, ge=0, description="GPUs per node")
    cpus_per_node: int | None = Field(default=None, ge=1, description="CPU cores per node; procs_per_node if unset")
    mem_per_node: int | None = Field(default=None, ge=1, description="memory per node in MiB ('16G' accepted)")
    time_limit: int | None = Field(default=None, ge=1, description="seconds ('01:30:00', '90m' accepted)")
    priority: int = Field(default=0, description="higher runs first")
    max_retries: int = Field(default=0, ge=0, le=100, description="extra attempts after a failed one")
    requeue: bool = Field(
        default=False,
        description="the backend may put the job back in its queue itself (Slurm: node failure, preemption, "
        "scontrol requeue); each new run is the next attempt, as a retry is",
    )
    partition: str | None = Field(default=None, description="Slurm partition")
    run_dir: str | None = Field(default=None, description="run directory; chosen by clusterx when unset")
    backend: str = Field(default=DEFAULT_BACKEND, description="where it runs: a name in clusterx.backends.BACKENDS")
    backend_options: dict[str, str] = Field(default_factory=dict, description="backend-specific settings")
    submit_key: str = Field(
        default_factory=lambda: uuid.uuid4().hex, min_length=1, max_length=64, description="makes submit idempotent"
    )

    @field_validator("mem_per_node", mode="before")
    @classmethod
    def _parse_memory(cls, value: Any) -> Any:
        return parse_memory_mib(value) if isinstance(value, str) else value

    @field_validator("time_limit", mode="before")
    @classmethod
    def _parse_time(cls, value: Any) -> Any:
        return parse_duration_seconds(value) if isinstance(value, str) else value

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        if value not in BACKENDS:
            raise ValueError(f"unknown backend {value!r}; choose one of {', '.join(BACKENDS)}")
        return value

    @field_validator("command")
    @classmethod
    def _nonempty_program(cls, value: list[str]) -> list[str]:
        if not value[0]:
            raise ValueError("the program (first element of command) is empty")
        return value

    @field_validator("env")
    @classmethod
    def _no_secrets(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not ENV_KEY.match(key):
                raise ValueError(f"environment variable name {key!r} is not made of letters, digits and '_'")
            if looks_secret(key):
                raise ValueError(
                    f"environment variable {key} looks like a secret; clusterx stores the environment in its "
                    "database and in batch scripts, so it refuses it. Put the secret in a file only you can read "
                    "(chmod 600) and give the job that file's path instead"
                )
        return value

    @model_validator(mode="after")
    def _requeue_where_possible(self) -> JobSpec:
        if self.requeue and not BACKENDS[self.backend].supports_requeue:
            able = ", ".join(name for name, info in BACKENDS.items() if info.supports_requeue)
            raise ValueError(
                f"the {self.backend} backend cannot requeue a job itself (backends that can: {able}); "
                "max_retries gives the same from your side: each new run is the next attempt, in the same run "
                "directory, with CLUSTERX_ATTEMPT counting up"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("name"):
            command = data.get("command")
            if isinstance(command, list) and command and isinstance(command[0], str) and command[0]:
                return {**data, "name": Path(command[0]).name}
        return data

    @property
    def cpus_needed(self) -> int:
        """CPU cores per node this job holds: cpus_per_node, else one per process."""
        return self.cpus_per_node if self.cpus_per_node is not None else self.procs_per_node

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @classmethod
    def from_toml(cls, path: str | Path, overrides: Mapping[str, Any] | None = None) -> JobSpec:
        """Read a spec file; one clear SpecError naming the file and key on any problem."""
        path = Path(path)
        data = read_spec_file(path)
        data.update(overrides or {})
        return cls.from_mapping(data, source=str(path))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "spec") -> JobSpec:
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise SpecError(describe_validation_error(exc, source)) from None


def describe_validation_error(exc: ValidationError, source: str, model: type[BaseModel] = JobSpec) -> str:
    """One line per problem of `model` (a JobSpec, a JobRecord): '<source>: key <k>: <message>'."""
    lines = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden" and len(error["loc"]) == 1:
            message = f"unknown key (known keys: {', '.join(sorted(model.model_fields))})"
        elif error["type"] == "extra_forbidden":
            message = "unknown key"
        elif error["type"] == "missing":
            message = "required key is missing"
        lines.append(f"{source}: key {key!r}: {message}")
    return "\n".join(lines)
