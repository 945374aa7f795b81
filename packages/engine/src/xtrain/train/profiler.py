"""The PyTorch profiler over the steps of ``trace.profile_steps``: one Kineto trace per rank in RUN_DIR/profiler/.

Kineto (libkineto, C++) writes notices straight to file descriptor 2 when a trace starts and stops
(``USDT:... SyncActivityProfilerHandler.cpp:52] profiler_start`` and ``profiler_stop``), whatever
``KINETO_LOG_LEVEL`` says, so every rank printed them to the user's terminal. While the profiler changes state
(its start, each ``step()``, its stop), descriptor 2 goes to a temporary file instead; afterwards Kineto's
informational lines are appended to the rank's log and everything else (a warning, an error, a Python
traceback) is written to the real stderr, so real errors stay visible.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from deeptrace.rundir import layout

from xtrain.config import TrainConfig
from xtrain.parallel.distributed import Distributed

# Kineto's informational lines: LEVEL:YYYY-MM-DD HH:MM:SS PID:TID File.cpp:LINE] text. WARNING and ERROR lines
# are not matched: they go on to the terminal. Also the CPU allocator's notice, under a memory profile, that a
# tensor allocated before profiling was freed (``trace.memory``: expected, the measure accounts for it).
_KINETO_NOTICE = re.compile(
    rb"^(?:(?:USDT|INFO|STAGE|VERBOSE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+:\d+\] "
    rb"|\[W\d{4} [\d:.]+ CPUAllocator\.cpp:\d+\] Memory block of unknown size)"
)


@contextlib.contextmanager
def kineto_notices_to(log_path: Path) -> Iterator[None]:
    """Within the block, what is written to file descriptor 2 is held back; at its end Kineto's notices are
    appended to ``log_path`` and the rest is written to descriptor 2 as it came."""
    sys.stderr.flush()  # Python's buffered stderr text belongs before the block, where it was written
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            notices, others = _split(held.read())
            if notices:
                with log_path.open("ab") as log_file:
                    log_file.write(notices)
            if others:
                os.write(2, others)


def _split(text: bytes) -> tuple[bytes, bytes]:
    """(Kineto's notices, everything else), each in the order written."""
    notices: list[bytes] = []
    others: list[bytes] = []
    for line in text.splitlines(keepends=True):
        (notices if _KINETO_NOTICE.match(line) else others).append(line)
    return b"".join(notices), b"".join(others)


class _QuietProfile(torch.profiler.profile):
    """``torch.profiler.profile`` whose state changes keep Kineto's notices in the rank's log."""

    def __init__(self, log_path: Path, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]  # the keyword arguments of the profiler, passed on
        self._log_path = log_path

    def start(self) -> None:
        with kineto_notices_to(self._log_path):
            super().start()

    def step(self) -> None:
        with kineto_notices_to(self._log_path):
            super().step()

    def stop(self) -> None:
        with kineto_notices_to(self._log_path):
            super().stop()


def profiled_steps(config: TrainConfig) -> range:
    """The steps during which the Kineto profiler of ``trace.profile_steps`` runs (its warm-up step included)."""
    steps = sorted(set(config.trace.profile_steps))
    return range(max(steps[0] - 1, 1), steps[-1] + 1) if steps else range(0)


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

    log_path = layout.log_path(run_dir, dist_ctx.rank)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with _QuietProfile(log_path, activities=activities, schedule=which, on_trace_ready=save) as prof:
        yield prof
