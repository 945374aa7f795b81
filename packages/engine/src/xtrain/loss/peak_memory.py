"""Peak memory allocated by a call, above what was allocated when it began: how the chunked loss's memory claim
is tested (tests/engine/test_chunked_loss.py) and measured (tools/bench/chunk_loss.py).

On CUDA: the caching allocator's own statistics (max_memory_allocated minus memory_allocated at the start).
On the CPU: the PyTorch profiler with ``profile_memory=True`` records an event for every allocation and free
made through PyTorch's CPU allocator (sizes signed: + allocated, - freed); their running sum in time order is
the memory held by tensors created during the call, and its maximum is the peak. This counts exactly the
tensors' bytes, independent of what malloc or the kernel do with freed pages, and tensors that existed before
the call are not counted (freeing one counts negative, as it should: the figure is the increase).
"""

from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile


def peak_allocated_bytes(fn: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """Run `fn()` once and return the peak of bytes allocated on `device` during it, above the starting level."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device)) - start
    if device.type != "cpu":
        raise ValueError(f"peak_allocated_bytes: device {device} is neither cpu nor cuda")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return _peak_of_cpu_memory_events(prof)


def _peak_of_cpu_memory_events(prof: profile) -> int:
    # The raw event list keeps every "[memory]" event with its signed size; the aggregated FunctionEvents fold
    # allocations into the op that made them and lose their order.
    results: Any = prof.profiler.kineto_results  # type: ignore[union-attr]
    memory_events = [e for e in results.events() if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")]
    memory_events.sort(key=lambda e: e.start_ns())
    held = peak = 0
    for event in memory_events:
        held += int(event.nbytes())
        peak = max(peak, held)
    return peak
