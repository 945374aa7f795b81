"""One sample of this machine's resources: CPU, memory and GPUs (through NVML, when there are any).

On a machine without an NVIDIA driver NVML is missing; that is the normal case on a CPU machine, so it yields an
empty GPU list rather than an error.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil
import pynvml


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str
    utilization_pct: float
    memory_used_bytes: int
    memory_total_bytes: int


@dataclass(frozen=True)
class ResourceSample:
    cpu_pct: float  # all cores together, 0–100, since the previous sample
    cpu_count: int
    memory_used_bytes: int
    memory_total_bytes: int
    gpus: tuple[GpuSample, ...]
    gpu_note: str  # why there are no GPUs, when there are none

    @property
    def memory_pct(self) -> float:
        return 100.0 * self.memory_used_bytes / self.memory_total_bytes if self.memory_total_bytes else 0.0


def sample_gpus() -> tuple[tuple[GpuSample, ...], str]:
    """GPUs seen by NVML and, when there are none, the reason in a few words."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return (), f"no NVIDIA driver ({error})"
    try:
        samples = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            utilization = pynvml.nvmlDeviceGetUtilizationRates(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            samples.append(
                GpuSample(
                    index=index,
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    utilization_pct=float(utilization.gpu),
                    memory_used_bytes=int(memory.used),
                    memory_total_bytes=int(memory.total),
                )
            )
        return tuple(samples), "" if samples else "NVML sees no GPU"
    finally:
        pynvml.nvmlShutdown()


def sample_resources() -> ResourceSample:
    memory = psutil.virtual_memory()
    gpus, note = sample_gpus()
    return ResourceSample(
        cpu_pct=psutil.cpu_percent(interval=None),
        cpu_count=psutil.cpu_count() or 1,
        memory_used_bytes=int(memory.total - memory.available),
        memory_total_bytes=int(memory.total),
        gpus=gpus,
        gpu_note=note,
    )
