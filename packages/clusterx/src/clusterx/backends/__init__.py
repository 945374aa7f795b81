"""Scheduler backends: their registry (what exists and what each can do) and the interface they implement.

`get_backend("slurm", options)` returns `clusterx.backends.slurm.SlurmBackend(options)`; "local" the embedded
daemon's backend; "fake" a backend driven through files, for tests. See `clusterx.backends.registry`.
"""

from __future__ import annotations

from clusterx.backends.registry import (
    BACKEND_NAMES,
    BACKENDS,
    DEFAULT_BACKEND,
    BackendInfo,
    backend_info,
    daemon_backends,
    get_backend,
    pollable_backends,
)

__all__ = [
    "BACKENDS",
    "BACKEND_NAMES",
    "DEFAULT_BACKEND",
    "BackendInfo",
    "backend_info",
    "daemon_backends",
    "get_backend",
    "pollable_backends",
]
