"""The process group of a training job: torchrun's environment, or a single process without it.

NCCL on CUDA, gloo on CPU. A single process (no torchrun) still gets a process group of size one, so the same
sharded code path runs everywhere (FSDP2 needs a mesh).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

# Private, as there is no public way to clear these caches (see _forget_mesh_caches).
from torch.distributed.tensor._redistribute import _gen_transform_infos, clear_redistribute_planner_cache
from torch.distributed.tensor.debug import _clear_sharding_prop_cache


@dataclass(frozen=True)
class Distributed:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    """Whether torchrun (or another launcher speaking its environment) started this process."""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"))


def init_distributed(device_type: str | None = None) -> Distributed:
    """Start the process group from torchrun's environment (or a one-process group) and pick the device.

    ``device_type`` None: CUDA when available, else CPU.
    """
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if launched_by_torchrun():
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ["LOCAL_RANK"])
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    else:
        rank, world_size, local_rank, local_world_size = 0, 1, 0, 1
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    if device_type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
    return Distributed(rank, world_size, local_rank, local_world_size, device, backend)


def close_distributed() -> None:
    """End the process group, and forget what DTensor cached about its meshes, so that a later process group in
    this process (tests run several jobs in one set of processes) starts clean."""
    if dist.is_initialized():
        dist.destroy_process_group()
    _forget_mesh_caches()


def _forget_mesh_caches() -> None:
    # DTensor caches sharding propagation and redistribution plans by spec, and a DeviceMesh compares equal to a
    # mesh of the same shape and dimension names from an earlier process group: a later job would get back specs
    # holding the old mesh, whose communicator names now mean other groups (seen: an EP job after another EP job
    # whose ep dimension had the same shape gathered its experts over a one-rank group).
    _clear_sharding_prop_cache()  # type: ignore[no-untyped-call]  # torch leaves it untyped
    _gen_transform_infos.cache_clear()
    clear_redistribute_planner_cache()


def barrier() -> None:
    """All ranks meet here (a no-op without a process group)."""
    if dist.is_initialized():
        dist.barrier()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
