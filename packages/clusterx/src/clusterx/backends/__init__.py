"""Backend registry: a backend by name, imported only when asked for (so `clusterx --help` stays fast).

`get_backend("slurm", options)` returns `clusterx.backends.slurm.SlurmBackend(options)`; "local" the embedded
daemon's backend; "fake" an in-process backend driven through files, for tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clusterx.backends.base import Backend
from clusterx.errors import SpecError

BACKEND_NAMES = ("local", "slurm", "fake")


def get_backend(name: str, options: Mapping[str, str] | None = None, **context: Any) -> Backend:
    """The backend called `name`, built with its options.

    `context` carries what the embedded backend needs from the client (the database URL for "local");
    other backends ignore it.
    """
    if name == "slurm":
        from clusterx.backends.slurm import SlurmBackend  # noqa: PLC0415 (lazy: keeps --help fast)

        return SlurmBackend(options)
    if name == "local":
        from clusterx.backends.local import LocalBackend  # noqa: PLC0415 (lazy: keeps --help fast)

        return LocalBackend(options, **context)
    if name == "fake":
        from clusterx.backends.fake import FakeBackend  # noqa: PLC0415 (lazy: keeps --help fast)

        return FakeBackend(options)
    raise SpecError(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")


def is_pollable(backend: Backend) -> bool:
    """True when the client learns the job's state by polling (Slurm, fake); the local daemon writes it itself."""
    return bool(getattr(backend, "pollable", True))
