"""What this machine offers to local jobs: CPU cores, memory and GPUs (through NVML; none when there is no GPU
or no driver — quietly, since that is the normal case on a CPU machine)."""

from __future__ import annotations

import psutil

from clusterx.store import Capacity

__all__ = ["Capacity", "gpu_indices", "machine_capacity"]

MIB = 1024 * 1024


def gpu_indices() -> list[int]:
    """Indices of the GPUs NVML sees; [] without GPUs, without a driver or without nvidia-ml-py."""
    try:
        import pynvml  # noqa: PLC0415 (lazy: only the daemon and GPU requests need NVML)
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        return list(range(pynvml.nvmlDeviceGetCount()))
    finally:
        pynvml.nvmlShutdown()


def machine_capacity() -> Capacity:
    return Capacity(
        cpus=psutil.cpu_count(logical=True) or 1,
        mem_mib=psutil.virtual_memory().total // MIB,
        gpus=len(gpu_indices()),
    )
