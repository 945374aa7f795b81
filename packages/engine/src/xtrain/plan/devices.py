"""The devices `xtrain plan --device NAME` knows: capacity, peak rates, links, and the efficiencies the roofline
assumes. Every figure is named and cited in docs/plan.md ("Device figures and assumptions"); change it there too.

Rates are per device: ``intra_bytes_per_s`` is what one GPU can send to the others of its node (NVLink, one
direction), ``inter_bytes_per_s`` what it can send off the node (its share of the node's network: one 400 Gb/s
NIC per GPU on the DGX/HGX systems listed). The efficiencies are the fractions of those peaks that well-tuned
kernels reach at training sizes (large bf16 GEMMs; NCCL's bus bandwidth at large messages).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from xtrain.errors import ConfigError

GB = 10**9
GIB = 2**30


@dataclass(frozen=True)
class Device:
    name: str
    memory_bytes: int
    """What the training process may allocate (the data sheet's capacity)."""
    peak_flops_bf16: float
    """Dense (no sparsity) bf16 tensor-core peak, FLOP/s."""
    peak_flops_fp32: float
    """Dense fp32 peak, FLOP/s (plain FP32: PyTorch's default matmul precision)."""
    memory_bytes_per_s: float
    """Device-memory bandwidth (the optimizer step is bound by it)."""
    intra_bytes_per_s: float
    inter_bytes_per_s: float
    host_bytes_per_s: float
    """Device ↔ host, one direction (PCIe): what activation offload moves over."""
    matmul_efficiency: float
    """Fraction of the peak the model's matmuls reach."""
    link_efficiency: float
    """Fraction of a link's peak that collectives reach (NCCL bus bandwidth / peak)."""
    allocator_headroom: float
    """Fraction of the tensor peak added for the caching allocator's fragmentation."""

    def peak_flops(self, bf16: bool) -> float:
        return self.peak_flops_bf16 if bf16 else self.peak_flops_fp32


def _hopper(name: str, memory_bytes: int, memory_bytes_per_s: float, intra_bytes_per_s: float) -> Device:
    """H100, H200 and H800 share the compute (and their NICs and PCIe); memory and NVLink differ."""
    return Device(
        name, memory_bytes=memory_bytes, peak_flops_bf16=989.4e12, peak_flops_fp32=66.9e12,
        memory_bytes_per_s=memory_bytes_per_s, intra_bytes_per_s=intra_bytes_per_s, inter_bytes_per_s=50 * GB,
        host_bytes_per_s=55 * GB, matmul_efficiency=0.70, link_efficiency=0.80, allocator_headroom=0.08,
    )  # fmt: skip


DEVICES: dict[str, Device] = {
    "h100": _hopper("h100", 80 * GIB, 3.35e12, 450 * GB),
    "h200": _hopper("h200", 141 * GB, 4.8e12, 450 * GB),
    "h800": _hopper("h800", 80 * GIB, 3.35e12, 200 * GB),
    "a100": Device(
        "a100", memory_bytes=80 * GIB, peak_flops_bf16=312e12, peak_flops_fp32=19.5e12, memory_bytes_per_s=2.04e12,
        intra_bytes_per_s=300 * GB, inter_bytes_per_s=25 * GB, host_bytes_per_s=26 * GB, matmul_efficiency=0.75,
        link_efficiency=0.80, allocator_headroom=0.08,
    ),
    "b200": Device(
        "b200", memory_bytes=180 * GB, peak_flops_bf16=2.25e15, peak_flops_fp32=75e12, memory_bytes_per_s=7.7e12,
        intra_bytes_per_s=900 * GB, inter_bytes_per_s=50 * GB, host_bytes_per_s=55 * GB, matmul_efficiency=0.65,
        link_efficiency=0.80, allocator_headroom=0.08,
    ),
}  # fmt: skip

DEVICE_NAMES = (*DEVICES, "cpu")


def device(name: str) -> Device:
    """The device called ``name`` (one of DEVICE_NAMES); ``cpu`` is this machine, measured."""
    key = name.lower()
    if key == "cpu":
        return this_cpu()
    if key not in DEVICES:
        raise ConfigError(f"unknown device {name!r}: choose one of {', '.join(DEVICE_NAMES)}")
    return DEVICES[key]


def this_cpu() -> Device:
    """This machine as a device: its memory, its measured matmul rate (the one MFU uses on the CPU), and loopback
    rates for gloo between its processes (documented, not measured)."""
    import torch  # noqa: PLC0415

    from xtrain.train.metrics import measured_cpu_peak_flops  # noqa: PLC0415 (torch matmuls: only when asked)

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Device(
        "cpu", memory_bytes=memory, peak_flops_bf16=measured_cpu_peak_flops(torch.bfloat16),
        peak_flops_fp32=measured_cpu_peak_flops(torch.float32), memory_bytes_per_s=10 * GB,
        intra_bytes_per_s=2 * GB, inter_bytes_per_s=1.25 * GB, host_bytes_per_s=10 * GB, matmul_efficiency=0.8,
        link_efficiency=0.5, allocator_headroom=0.0,
    )  # fmt: skip
