"""What this machine offers to local jobs: CPU cores, memory and GPUs (through NVML; none when there is no GPU
or no driver — quietly, since that is the normal case on a CPU machine)."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

MIB = 1024 * 1024


@dataclass(frozen=True)
class Capacity:
    cpus: int
    mem_mib: int
    gpus: int

    def fits(self, cpus: int, mem_mib: int, gpus: int) -> bool:
        return cpus <= self.cpus and mem_mib <= self.mem_mib and gpus <= self.gpus

    def minus(self, cpus: int, mem_mib: int, gpus: int) -> Capacity:
        return Capacity(self.cpus - cpus, self.mem_mib - mem_mib, self.gpus - gpus)


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
