"""xtrain.train.metrics: memory figures of one measure family, the fp32 peak with and without TF32, a measured
CPU peak (so metrics.jsonl has `mfu` on the CPU)."""

from __future__ import annotations

import pytest
import torch
from xtrain.train import metrics
from xtrain.train.metrics import device_peak_flops, gpu_peak_flops, memory_figures, mfu

CPU = torch.device("cpu")


def test_cpu_peak_memory_is_never_below_allocated_over_calls_with_allocations_between() -> None:
    seen = [memory_figures(CPU)]
    held = []
    for _ in range(4):
        block = torch.ones(8 << 20, dtype=torch.float64)  # 64 MiB, written so that its pages are resident
        held.append(block)
        seen.append(memory_figures(CPU))
    held.clear()
    seen.append(memory_figures(CPU))
    for figures in seen:
        assert figures.peak >= figures.allocated > 0
        assert figures.reserved is None  # a CUDA allocator's figure only
    peaks = [figures.peak for figures in seen]
    assert peaks == sorted(peaks)  # a high-water mark: it never goes down
    assert peaks[-1] >= max(figures.allocated for figures in seen)
    assert seen[4].allocated - seen[0].allocated >= 200 << 20  # RSS grew by the blocks


@pytest.mark.parametrize(
    ("name", "tf32", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", True, 494.7e12),
        ("NVIDIA H100 80GB HBM3", False, 66.9e12),
        ("NVIDIA H200", False, 66.9e12),
        ("NVIDIA H100 PCIe", True, 378e12),
        ("NVIDIA H100 PCIe", False, 51.2e12),
        ("NVIDIA A100-SXM4-80GB", True, 156e12),
        ("NVIDIA A100-SXM4-80GB", False, 19.5e12),
    ],
)
def test_fp32_peak_is_the_tf32_one_only_when_tf32_is_enabled(name: str, tf32: bool, expected: float) -> None:
    assert gpu_peak_flops(name, torch.float32, tf32=tf32) == expected


def test_bf16_peak_does_not_depend_on_tf32_and_unknown_devices_have_none() -> None:
    for tf32 in (True, False):
        assert gpu_peak_flops("NVIDIA H100 80GB HBM3", torch.bfloat16, tf32=tf32) == 989.4e12
    assert gpu_peak_flops("NVIDIA GeForce GTX 1080", torch.float32, tf32=False) is None
    assert gpu_peak_flops("NVIDIA H100 80GB HBM3", torch.float64, tf32=False) is None


def test_tf32_setting_is_read_from_torch() -> None:
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert not metrics.fp32_matmuls_use_tf32()
        torch.set_float32_matmul_precision("high")
        assert metrics.fp32_matmuls_use_tf32()
    finally:
        torch.set_float32_matmul_precision(before)


def test_cuda_device_peak_follows_the_tf32_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(metrics, "fp32_matmuls_use_tf32", lambda: False)
    assert device_peak_flops(cuda, torch.float32) == 66.9e12
    monkeypatch.setattr(metrics, "fp32_matmuls_use_tf32", lambda: True)
    assert device_peak_flops(cuda, torch.float32) == 494.7e12


def test_cpu_peak_is_measured_once_and_gives_an_mfu() -> None:
    metrics._measure_matmul_rate.cache_clear()
    state = torch.get_rng_state()
    peak = device_peak_flops(CPU, torch.float32)
    assert peak is not None and 1e8 < peak < 1e14  # between 0.1 GFLOP/s and 100 TFLOP/s
    assert torch.equal(torch.get_rng_state(), state)  # the training's generator is not advanced
    assert metrics._measure_matmul_rate.cache_info().misses == 1
    assert device_peak_flops(CPU, torch.float32) == peak  # measured once: the second call is the cache's
    assert metrics._measure_matmul_rate.cache_info().hits == 1
    utilisation = mfu(1e6, peak / 1e7, peak)
    assert utilisation == pytest.approx(0.1)
