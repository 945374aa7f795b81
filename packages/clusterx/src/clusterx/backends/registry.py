"""The one list of backends and what each can do. Everything that depends on a backend's nature asks here (the
command line's choices, the client, the store, the spec's validation); nothing else branches on a backend's name.

Kept to the standard library: the command line reads it before anything heavy is loaded. A backend's class is
imported only when `get_backend` builds one.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from clusterx.errors import SpecError

if TYPE_CHECKING:
    from clusterx.backends.base import Backend


class BackendInfo(NamedTuple):  # a named tuple, not a dataclass: `dataclasses` would cost the CLI's start 2 ms
    name: str
    implementation: str  # "module:Class", imported on first use
    needs_daemon: bool  # a clusterx daemon runs its jobs and writes their states (it is started on demand)
    pollable: bool  # the client learns its jobs' states by asking it (`Backend.poll`)
    supports_arrays: bool  # it can run one spec as an array of jobs (none does yet: no spec key asks for it)
    supports_requeue: bool  # it can put a running job back in its queue itself (the spec's `requeue`)
    summary: str


BACKENDS: dict[str, BackendInfo] = {
    info.name: info
    for info in (
        BackendInfo(
            name="local",
            implementation="clusterx.backends.local:LocalBackend",
            needs_daemon=True,
            pollable=False,
            supports_arrays=False,
            supports_requeue=False,
            summary="this machine, through the embedded scheduler daemon",
        ),
        BackendInfo(
            name="slurm",
            implementation="clusterx.backends.slurm:SlurmBackend",
            needs_daemon=False,
            pollable=True,
            supports_arrays=False,
            supports_requeue=True,
            summary="a Slurm cluster (sbatch, squeue, sacct, scancel)",
        ),
        BackendInfo(
            name="fake",
            implementation="clusterx.backends.fake:FakeBackend",
            needs_daemon=False,
            pollable=True,
            supports_arrays=False,
            supports_requeue=False,
            summary="a cluster played through JSON files, for tests",
        ),
    )
}
BACKEND_NAMES = tuple(BACKENDS)
DEFAULT_BACKEND = "local"


def backend_info(name: str) -> BackendInfo:
    info = BACKENDS.get(name)
    if info is None:
        raise SpecError(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    return info


def pollable_backends() -> list[str]:
    return [info.name for info in BACKENDS.values() if info.pollable]


def daemon_backends() -> list[str]:
    return [info.name for info in BACKENDS.values() if info.needs_daemon]


def get_backend(name: str, options: Mapping[str, str] | None = None, *, db_url: str | None = None) -> Backend:
    """The backend called `name`, built with its options. A backend run by the daemon also gets the database
    URL (its daemon serves that database); the others do not need it."""
    info = backend_info(name)
    module_name, _, class_name = info.implementation.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    backend: Backend = cls(options, db_url=db_url) if info.needs_daemon else cls(options)
    return backend
