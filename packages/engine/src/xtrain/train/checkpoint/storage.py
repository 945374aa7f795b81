"""DCP's file writer, plus the one test hook of the checkpoint code.

``XTRAIN_TEST_PAUSE_IN_SAVE=STEP:SECONDS`` (tests only): in the save of step STEP, after a rank has written its
data file and before DCP's coordinator writes ``.metadata`` and xtrain the completion marker, the writer sleeps
SECONDS, so a test can kill a rank in the middle of that save from outside
(tests/engine/checkpoint/test_kill_and_resume.py). Read here and nowhere else; unset, nothing changes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

PAUSE_ENV = "XTRAIN_TEST_PAUSE_IN_SAVE"


class CheckpointWriter(FileSystemWriter):
    """One file per rank, each fsynced (``sync_files``) before the coordinator writes the metadata.

    One writer serves every save of a run (DCP points it at each step's folder through ``checkpoint_id``), so an
    asynchronous save reuses the host-memory copy of the previous one (``cache_staged_state_dict``): staging is
    then a copy into memory already there, not an allocation of the whole state and its page faults. DCP's
    cache pins that memory, which needs CUDA: on a CPU-only machine each save allocates its copy afresh."""

    def __init__(self, folder: Path) -> None:
        cache = torch.cuda.is_available()
        super().__init__(folder, single_file_per_rank=True, sync_files=True, cache_staged_state_dict=cache)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        written = super().write_data(plan, planner)
        pause = _test_pause(Path(self.path))
        if pause > 0:
            written.wait()
            time.sleep(pause)
        return written


def _test_pause(folder: Path) -> float:
    step, _, seconds = os.environ.get(PAUSE_ENV, "").partition(":")
    return float(seconds) if step and folder.name == f"step-{step}" else 0.0
