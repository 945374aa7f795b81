"""The PyTorch profiler over the steps of ``trace.profile_steps``: one Kineto trace per rank in RUN_DIR/profiler/."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from deeptrace.rundir import layout

from xtrain.config import TrainConfig
from xtrain.parallel.distributed import Distributed


@contextlib.contextmanager
def kineto_profiler(
    config: TrainConfig, run_dir: Path, dist_ctx: Distributed
) -> Iterator[torch.profiler.profile | None]:
    """The PyTorch profiler from the first to the last step of ``trace.profile_steps`` (one window), one Kineto
    trace per rank in RUN_DIR/profiler/, which ``deeptrace analyze`` reads."""
    steps = sorted(set(config.trace.profile_steps))
    if not steps:
        yield None
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if dist_ctx.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    out = layout.profiler_dir(run_dir)
    out.mkdir(parents=True, exist_ok=True)

    first, last = steps[0], steps[-1]

    def which(index: int) -> torch.profiler.ProfilerAction:
        # `index` counts the profiler's step() calls, made after each training step: index i is step i + 1.
        step = index + 1
        if step == first - 1:
            return torch.profiler.ProfilerAction.WARMUP
        if first <= step < last:
            return torch.profiler.ProfilerAction.RECORD
        if step == last:
            return torch.profiler.ProfilerAction.RECORD_AND_SAVE
        return torch.profiler.ProfilerAction.NONE

    def save(prof: torch.profiler.profile) -> None:
        prof.export_chrome_trace(str(out / f"rank-{dist_ctx.rank}.json"))

    with torch.profiler.profile(activities=activities, schedule=which, on_trace_ready=save) as prof:
        yield prof
