"""clusterx: one command line and one SQL job history for a workstation (embedded daemon) and Slurm clusters.

`clusterx.Client` is the Python API (imported on first use, so that `clusterx --help` stays fast).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Client", "JobSpec", "JobState", "__version__"]

if TYPE_CHECKING:
    from clusterx.client import Client
    from clusterx.spec import JobSpec
    from clusterx.states import JobState


def __getattr__(name: str) -> Any:
    if name == "Client":
        from clusterx.client import Client  # noqa: PLC0415 (lazy, see module doc)

        return Client
    if name == "JobSpec":
        from clusterx.spec import JobSpec  # noqa: PLC0415

        return JobSpec
    if name == "JobState":
        from clusterx.states import JobState  # noqa: PLC0415

        return JobState
    raise AttributeError(f"module 'clusterx' has no attribute {name!r}")
