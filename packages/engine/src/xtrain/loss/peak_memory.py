"""Peak memory allocated by a call, above what was allocated when it began: how the chunked loss's memory claim
is tested (tests/engine/test_chunked_loss.py) and measured (tools/bench/chunk_loss.py), and how ``trace.memory``
measures a training step (:func:`measure_peak`, with :func:`live_tensor_bytes` for the level it starts from).

On CUDA: the caching allocator's own statistics (max_memory_allocated minus memory_allocated at the start).
On the CPU: the PyTorch profiler with ``profile_memory=True`` records an event for every allocation and free
made through PyTorch's CPU allocator (sizes signed: + allocated, - freed); their running sum in time order is
the memory held by tensors created during the call, and its maximum is the peak. This counts exactly the
tensors' bytes, independent of what malloc or the kernel do with freed pages. Tensors that existed before the
call are not counted; the profiler knows the size only of blocks allocated while it (or an earlier profiler of
the process) ran, so freeing an older tensor during the call is not subtracted, and the figure is the peak of
what the call itself allocated.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.profiler import ProfilerActivity, profile

Result = TypeVar("Result")


def peak_allocated_bytes(fn: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """Run `fn()` once and return the peak of bytes allocated on `device` during it, above the starting level."""
    return measure_peak(fn, device)[1]


def measure_peak(fn: Callable[[], Result], device: torch.device | str = "cpu") -> tuple[Result, int]:
    """Run `fn()` once: its result and the peak of bytes allocated on `device` during it, above the starting
    level."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        result = fn()
        torch.cuda.synchronize(device)
        return result, int(torch.cuda.max_memory_allocated(device)) - start
    if device.type != "cpu":
        raise ValueError(f"peak_allocated_bytes: device {device} is neither cpu nor cuda")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    return result, _peak_of_cpu_memory_events(prof)


def live_tensor_bytes(device: torch.device | str = "cpu") -> int:
    """Bytes held by tensors on `device` now. CUDA: the caching allocator's ``memory_allocated``. CPU: the
    storages of every tensor the garbage collector can reach from Python (each storage once; a DTensor counts
    through its local tensor), which at a step's start are the parameters, gradients, optimizer state, buffers
    and the step's inputs; tensors that only C++ holds are not seen."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    storages: dict[int, int] = {}
    for obj in gc.get_objects():
        if type(obj) not in (torch.Tensor, torch.nn.Parameter) or obj.device.type != device.type:
            continue  # subclasses (DTensor, fake tensors) hold no storage of their own
        storage = obj.untyped_storage()
        storages[storage.data_ptr()] = max(storages.get(storage.data_ptr(), 0), storage.nbytes())
    storages.pop(0, None)  # empty storages (freed FSDP buffers) share the null pointer
    return sum(storages.values())


def _peak_of_cpu_memory_events(prof: profile) -> int:
    return running_peak(_allocation_events(prof))


def running_peak(events: list[tuple[int, int]]) -> int:
    """The peak of the bytes held over (address, signed bytes) allocation events in time order, kept by address
    (see the module docstring): a block still held where a new one is allocated leaves the sum then."""
    held = peak = 0
    blocks: dict[int, int] = {}  # address -> bytes of the blocks the sum holds
    for address, nbytes in events:
        if nbytes > 0:
            held += nbytes - blocks.pop(address, 0)  # a block still held at this address was freed off-thread
            blocks[address] = nbytes
        else:
            blocks.pop(address, None)
            held += nbytes
        peak = max(peak, held)
    return peak


def _allocation_events(prof: profile) -> list[tuple[int, int]]:
    """(address, signed bytes) of every CPU allocation and free the profiler recorded, in time order."""
    from torch._C._profiler import _EventType  # noqa: PLC0415 (torch's profiler internals, imported on use)

    results: Any = prof.profiler.kineto_results  # type: ignore[union-attr]
    # The event tree carries each allocation's address (the flat Kineto events do not), nested under the op
    # that made it.
    found: list[tuple[int, int, int]] = []
    pending = list(results.experimental_event_tree())
    while pending:
        node = pending.pop()
        pending.extend(node.children)
        if node.tag == _EventType.Allocation:
            fields = node.extra_fields
            if fields.device.type == "cpu":
                found.append((node.start_time_ns, fields.ptr, fields.alloc_size))
    found.sort(key=lambda event: event[0])
    return [(address, nbytes) for _, address, nbytes in found]
