"""``trace.memory``: what one optimizer step held and sent, measured on this rank (ranks/rank-R.jsonl's
``mem_tensor_peak_bytes`` and ``comm_bytes``), to check ``xtrain plan`` against.

- Tensor peak: the bytes held by tensors at the step's start (:func:`xtrain.loss.peak_memory.live_tensor_bytes`)
  plus the peak of what the step allocated above that (:func:`xtrain.loss.peak_memory.measure_peak`: on CUDA the
  allocator's statistics, reset at the step's start; on the CPU the profiler's memory events). Two profilers
  cannot run at once, so on the CPU the steps of the Kineto profiler's window (``trace.profile_steps``) have no
  peak. The CPU allocator's notice that an older tensor was freed under the profile, and the profiler's own
  start and stop notices, go to the rank's log.
- Communication: every collective of the step counted by :class:`xtrain.parallel.comm_meter.CollectiveMeter`,
  with the convention the planner uses (:mod:`xtrain.parallel.comm_volume`).
- Routing, under expert parallelism: the rows each MoE layer's experts received on this rank in the step's last
  forward (:func:`xtrain.parallel.expert_parallel.received_rows`). The experts' activations scale with them, so a
  rank that receives more rows than uniform routing would send it holds more: the memory plan is checked with
  them (tools/bench/plan_accuracy.py).

The window is the optimizer step (forward, backward, clipping, update: ``train_step``); a checkpoint saved after
it is not part of it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

from xtrain.loss.peak_memory import live_tensor_bytes, measure_peak
from xtrain.parallel.comm_meter import CollectiveMeter
from xtrain.parallel.comm_volume import LinkBytes
from xtrain.train.profiler import kineto_notices_to

Result = TypeVar("Result")


@dataclass(frozen=True)
class StepMeasure:
    """What one step held and sent on this rank."""

    tensor_peak_bytes: int | None
    """The peak of bytes held by tensors on the device during the step (None: not measurable at this step)."""
    comm_bytes: dict[str, LinkBytes]
    """Bytes sent per collective kind, by link."""
    expert_rows: list[int] | None = None
    """Rows each MoE layer's experts received in the step's last forward (None without expert parallelism)."""


def measure_step(
    run: Callable[[], Result],
    device: torch.device,
    processes_per_node: int,
    *,
    log_path: Path,
    profiler_running: bool = False,
    expert_rows: Callable[[], list[int] | None] = lambda: None,
) -> tuple[Result, StepMeasure]:
    """``run()`` (one optimizer step) measured; ``profiler_running``: the Kineto profiler runs during this step
    (on the CPU the tensor peak is then not measured); ``expert_rows`` reads the routing after the step."""
    meter = CollectiveMeter(processes_per_node)

    def metered() -> Result:
        with meter:
            return run()

    if device.type == "cpu" and profiler_running:
        return metered(), StepMeasure(None, dict(meter.sent), expert_rows())
    quiet: AbstractContextManager[object] = (
        kineto_notices_to(log_path) if device.type == "cpu" else contextlib.nullcontext()
    )
    # Tensors of the last step left in reference cycles are still reachable until the collector runs; collected
    # here, the start level is what the step really starts from, not a count that depends on when gc last ran
    # (which moved the measured peak by several percent from one run to the next).
    gc.collect()
    start = live_tensor_bytes(device)
    with quiet:
        result, peak = measure_peak(metered, device)
    return result, StepMeasure(start + peak, dict(meter.sent), expert_rows())
