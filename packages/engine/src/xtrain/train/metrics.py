"""Figures of a step: throughput, model FLOP utilisation, memory.

MFU = achieved model FLOP/s per device / the device's peak dense FLOP/s for the training dtype. The model FLOPs
are those of ``xtrain.model.flops`` (6·N_active per token plus causal attention over the documents actually
packed). The peak is:

- on the NVIDIA data-centre GPUs below, the data sheet's dense figure for the dtype; for fp32 it depends on
  whether fp32 matmuls may use TF32 tensor cores (``torch.backends.cuda.matmul.fp32_precision``): with TF32 the
  TF32 tensor-core peak, without it (PyTorch's default) the plain FP32 peak, which is 4-8x lower, because that is
  what the matmuls then run at;
- on the CPU, measured once per process and dtype: the best rate of a few 512×512 matmuls with this process's
  thread count (``torch.get_num_threads()``), about 30 ms;
- otherwise unknown (None), and MFU is omitted rather than guessed.

Memory, one measure family per device, so that the peak is never below the current figure:

- CUDA: the caching allocator's bytes held by tensors now (``memory_allocated``), its high-water mark since the
  process started (``max_memory_allocated``), and what it has reserved from the driver (``memory_reserved``);
- CPU: the process's resident set now (``VmRSS`` of /proc/self/status), which is what can run out there, and
  its high-water mark since the process started: the kernel's ``VmHWM`` of the same read, raised to any resident
  figure read before (the kernel's counters are approximate and its VmHWM lags).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class _Peaks:
    """Dense (no sparsity) peak FLOP/s of one device: bf16 (and fp16) tensor cores, TF32 tensor cores, FP32."""

    bf16: float
    tf32: float
    fp32: float


# By a substring of torch.cuda.get_device_name(), most specific first ("H100 PCIe" before "H100"). Data sheets
# give tensor-core figures with sparsity; the dense ones are half of them.
# - H100 SXM5 / PCIe: NVIDIA H100 Tensor Core GPU Architecture whitepaper, table 3: BF16 989.4 / 756, TF32
#   494.7 / 378, FP32 (non-tensor) 66.9 / 51.2 TFLOPS. H800 and H200 SXM have the H100 SXM5's compute (H200
#   data sheet: FP32 67, TF32 989*, BF16 1,979* TFLOPS, *with sparsity).
# - H100 NVL, H200 NVL: data sheets: FP32 60, TF32 835*, BF16 1,671* TFLOPS.
# - A100 (SXM and PCIe), A800: A100 data sheet: FP32 19.5, TF32 156, BF16 312 TFLOPS (dense).
# - L40S: data sheet: FP32 91.6, TF32 183 (366*), BF16 362.05 (733*) TFLOPS.
_DEVICE_PEAKS: tuple[tuple[str, _Peaks], ...] = (
    ("H200 NVL", _Peaks(bf16=835.5e12, tf32=417.5e12, fp32=60e12)),
    ("H100 NVL", _Peaks(bf16=835.5e12, tf32=417.5e12, fp32=60e12)),
    ("H100 PCIe", _Peaks(bf16=756e12, tf32=378e12, fp32=51.2e12)),
    ("H200", _Peaks(bf16=989.4e12, tf32=494.7e12, fp32=66.9e12)),
    ("H100", _Peaks(bf16=989.4e12, tf32=494.7e12, fp32=66.9e12)),
    ("H800", _Peaks(bf16=989.4e12, tf32=494.7e12, fp32=66.9e12)),
    ("A100", _Peaks(bf16=312e12, tf32=156e12, fp32=19.5e12)),
    ("A800", _Peaks(bf16=312e12, tf32=156e12, fp32=19.5e12)),
    ("L40S", _Peaks(bf16=362.05e12, tf32=183e12, fp32=91.6e12)),
)


def gpu_peak_flops(device_name: str, dtype: torch.dtype, *, tf32: bool) -> float | None:
    """Dense peak FLOP/s of the GPU called ``device_name`` in ``dtype``; fp32 at the TF32 tensor-core peak when
    ``tf32`` (fp32 matmuls may use TF32), else at the FP32 peak. None for a device or dtype not known."""
    for key, peaks in _DEVICE_PEAKS:
        if key in device_name:
            if dtype in (torch.bfloat16, torch.float16):
                return peaks.bf16
            if dtype == torch.float32:
                return peaks.tf32 if tf32 else peaks.fp32
            return None
    return None


def fp32_matmuls_use_tf32() -> bool:
    """Whether CUDA fp32 matmuls may run on TF32 tensor cores now. Read through the backend's ``fp32_precision``
    (``"tf32"``, ``"ieee"``, or ``"none"``: follow ``torch.backends.fp32_precision``), which reflects the legacy
    ``allow_tf32`` / ``set_float32_matmul_precision`` settings too, and never raises when old and new APIs were
    mixed, as reading ``allow_tf32`` does."""
    precision = torch.backends.cuda.matmul.fp32_precision
    if precision == "none":
        # The global setting; read by name, since torch's type stubs leave it out.
        precision = getattr(torch.backends, "fp32_precision", "ieee")
    return bool(precision == "tf32")


def device_peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """Peak FLOP/s of one device in ``dtype`` (see the module's docstring), or None when not known."""
    if device.type == "cuda":
        return gpu_peak_flops(torch.cuda.get_device_name(device), dtype, tf32=fp32_matmuls_use_tf32())
    if device.type == "cpu":
        return measured_cpu_peak_flops(dtype)
    return None


_MATMUL_SIZE = 512  # 2·512³ = 0.27 GFLOP: a few ms per matmul on one core, large enough to reach the peak rate
_MEASURE_BUDGET_S = 0.03
_MAX_REPEATS = 8


def measured_cpu_peak_flops(dtype: torch.dtype) -> float:
    """The best matmul rate of this CPU in ``dtype`` with this process's current thread count, measured once
    per process, dtype and thread count (later calls are free)."""
    return _measure_matmul_rate(dtype, torch.get_num_threads())


@functools.cache
def _measure_matmul_rate(dtype: torch.dtype, threads: int) -> float:
    """One warm-up matmul, then up to ``_MAX_REPEATS`` timed ones within about ``_MEASURE_BUDGET_S``; the best
    rather than the mean, as a peak is what the machine can reach. The inputs are not random, so the training's
    random generators are not advanced."""
    del threads  # the cache key only: torch.mm runs with the current count, which is this one
    n = _MATMUL_SIZE
    a = torch.linspace(-1.0, 1.0, n * n).reshape(n, n).to(dtype)
    b = a.t().contiguous()
    out = torch.empty(n, n, dtype=dtype)
    torch.mm(a, b, out=out)  # warm-up: thread pool and kernel selection
    best = float("inf")
    deadline = time.perf_counter() + _MEASURE_BUDGET_S
    for _ in range(_MAX_REPEATS):
        started = time.perf_counter()
        torch.mm(a, b, out=out)
        finished = time.perf_counter()
        best = min(best, finished - started)
        if finished > deadline:
            break
    return 2.0 * n**3 / max(best, 1e-9)


@dataclass(frozen=True)
class MemoryFigures:
    """This process's memory now, in bytes, of one measure family (see the module's docstring)."""

    allocated: int
    peak: int
    """The high-water mark of ``allocated``: never below it."""
    reserved: int | None = None
    """What the CUDA caching allocator holds from the driver; None on the CPU."""


def memory_figures(device: torch.device) -> MemoryFigures:
    """This process's memory figures now (see the module's docstring)."""
    if device.type == "cuda":
        return MemoryFigures(
            allocated=torch.cuda.memory_allocated(device),
            peak=torch.cuda.max_memory_allocated(device),
            reserved=torch.cuda.memory_reserved(device),
        )
    resident, high_water = _resident_set_bytes()
    # The kernel's RSS counters are approximate (per-CPU) and VmHWM is raised lazily, so a read can show VmRSS
    # above VmHWM, and VmHWM below a VmRSS read earlier: the peak is also raised to every figure seen before.
    _cpu_high_water[0] = max(_cpu_high_water[0], high_water, resident)
    return MemoryFigures(allocated=resident, peak=_cpu_high_water[0])


_cpu_high_water = [0]  # the highest CPU resident-set figure this process has reported, bytes


def _resident_set_bytes() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in bytes, from one read of /proc/self/status (given there in kB)."""
    fields: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def mfu(flops_per_token: float, tokens_per_s_per_device: float, peak_flops: float | None) -> float | None:
    """Model FLOP utilisation in [0, 1], or None without a known peak."""
    if peak_flops is None or peak_flops <= 0:
        return None
    return flops_per_token * tokens_per_s_per_device / peak_flops
