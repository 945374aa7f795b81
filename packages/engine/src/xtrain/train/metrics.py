"""Figures of a step: throughput, model FLOP utilisation, memory.

MFU = achieved model FLOP/s per device / the device's peak dense FLOP/s in the training dtype. The model FLOPs are
those of ``xtrain.model.flops`` (6·N_active per token plus causal attention over the documents actually
packed); the peak is known for the NVIDIA data-centre GPUs below and unknown on CPUs, where MFU is omitted rather
than guessed.

Memory: on CUDA the caching allocator's allocated, peak and reserved bytes; on the CPU the process's resident set
(current, and the peak the kernel recorded), which is what can run out there.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

import torch

# Dense (no sparsity) tensor-core peaks from NVIDIA's data sheets, FLOP/s, by a substring of the device name.
_PEAK_FLOPS: dict[str, dict[torch.dtype, float]] = {
    "H200": {torch.bfloat16: 989.4e12, torch.float32: 494.7e12},
    "H100": {torch.bfloat16: 989.4e12, torch.float32: 494.7e12},
    "H800": {torch.bfloat16: 989.4e12, torch.float32: 494.7e12},
    "A100": {torch.bfloat16: 312e12, torch.float32: 156e12},
    "A800": {torch.bfloat16: 312e12, torch.float32: 156e12},
    "L40S": {torch.bfloat16: 362.05e12, torch.float32: 183e12},
}


def device_peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """Peak FLOP/s of one device in ``dtype`` (fp32 uses TF32 tensor cores), or None when not known."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peaks in _PEAK_FLOPS.items():
        if key in name:
            return peaks.get(dtype)
    return None


def memory_figures(device: torch.device) -> dict[str, int]:
    """mem_allocated_bytes, mem_peak_bytes (and mem_reserved_bytes on CUDA) of this process now."""
    if device.type == "cuda":
        return {
            "mem_allocated_bytes": torch.cuda.memory_allocated(device),
            "mem_peak_bytes": torch.cuda.max_memory_allocated(device),
            "mem_reserved_bytes": torch.cuda.memory_reserved(device),
        }
    resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    return {
        "mem_allocated_bytes": resident_pages * os.sysconf("SC_PAGE_SIZE"),
        # ru_maxrss is in KiB on Linux.
        "mem_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def mfu(flops_per_token: float, tokens_per_s_per_device: float, peak_flops: float | None) -> float | None:
    """Model FLOP utilisation in [0, 1], or None without a known peak."""
    if peak_flops is None or peak_flops <= 0:
        return None
    return flops_per_token * tokens_per_s_per_device / peak_flops
