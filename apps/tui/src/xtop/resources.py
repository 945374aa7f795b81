"""One sample of this machine's resources: CPU, memory and GPUs (through NVML, when there are any), and the
short histories the devices screen draws as sparklines.

On a machine without an NVIDIA driver NVML is missing; that is the normal case on a CPU machine, so it yields an
empty GPU list and the reason rather than an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from xtop.series import History

# psutil and NVML are imported where they are used: the dashboard paints before it first samples.


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str
    utilization_pct: float
    memory_used_bytes: int
    memory_total_bytes: int
    power_w: float | None  # None where the driver does not report it
    temperature_c: float | None

    @property
    def memory_pct(self) -> float:
        return 100.0 * self.memory_used_bytes / self.memory_total_bytes if self.memory_total_bytes else 0.0


@dataclass(frozen=True)
class ResourceSample:
    cpu_pct: float  # all cores together, 0–100, since the previous sample
    cpu_count: int
    memory_used_bytes: int
    memory_total_bytes: int
    gpus: tuple[GpuSample, ...]
    gpu_note: str  # why there are no GPUs, when there are none
    per_cpu_pct: tuple[float, ...] = ()

    @property
    def memory_pct(self) -> float:
        return 100.0 * self.memory_used_bytes / self.memory_total_bytes if self.memory_total_bytes else 0.0


def _optional(read: Callable[[], Any], nvml: Any) -> float | None:
    try:
        return float(read())
    except nvml.NVMLError:
        return None


def sample_gpus() -> tuple[tuple[GpuSample, ...], str]:
    """GPUs seen by NVML and, when there are none, the reason in a few words."""
    import pynvml  # noqa: PLC0415

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
            power_mw = _optional(partial(pynvml.nvmlDeviceGetPowerUsage, handle), pynvml)
            samples.append(
                GpuSample(
                    index=index,
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    utilization_pct=float(utilization.gpu),
                    memory_used_bytes=int(memory.used),
                    memory_total_bytes=int(memory.total),
                    power_w=None if power_mw is None else power_mw / 1000.0,
                    temperature_c=_optional(
                        partial(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU), pynvml
                    ),
                )
            )
        return tuple(samples), "" if samples else "NVML sees no GPU"
    except pynvml.NVMLError as error:
        return (), f"NVML failed ({error})"
    finally:
        pynvml.nvmlShutdown()


def sample_resources() -> ResourceSample:
    import psutil  # noqa: PLC0415

    memory = psutil.virtual_memory()
    gpus, note = sample_gpus()
    per_cpu = tuple(float(p) for p in psutil.cpu_percent(interval=None, percpu=True))
    return ResourceSample(
        cpu_pct=sum(per_cpu) / len(per_cpu) if per_cpu else 0.0,
        cpu_count=psutil.cpu_count() or 1,
        memory_used_bytes=int(memory.total - memory.available),
        memory_total_bytes=int(memory.total),
        gpus=gpus,
        gpu_note=note,
        per_cpu_pct=per_cpu,
    )


@dataclass
class ResourceHistory:
    """The newest sample and, per gauge, its last minute or so of values."""

    latest: ResourceSample | None = None
    cpu: History = field(default_factory=History)
    memory: History = field(default_factory=History)
    gpu_util: dict[int, History] = field(default_factory=dict)
    gpu_memory: dict[int, History] = field(default_factory=dict)
    gpu_power: dict[int, History] = field(default_factory=dict)

    def add(self, sample: ResourceSample) -> None:
        self.latest = sample
        self.cpu.add(sample.cpu_pct)
        self.memory.add(sample.memory_pct)
        for gpu in sample.gpus:
            self.gpu_util.setdefault(gpu.index, History()).add(gpu.utilization_pct)
            self.gpu_memory.setdefault(gpu.index, History()).add(gpu.memory_pct)
            if gpu.power_w is not None:
                self.gpu_power.setdefault(gpu.index, History()).add(gpu.power_w)
