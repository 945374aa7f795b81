"""``checkpoint.hf_every_steps``: a Hugging Face folder written from a complete checkpoint by another process.

Rank 0 starts ``xtrain export CHECKPOINT RUN_DIR/hf/step-N`` (through :mod:`xtrain.train.lifeline`, so it
dies with the rank) once the checkpoint of step N is complete,
so training is blocked only by the checkpoint save itself; the export reads the checkpoint's files, not the live
model. One export runs at a time (a next one waits for it). Its output goes to RUN_DIR/logs/hf-export-step-N.log;
``xtrain export`` writes into a temporary folder renamed at the end, so RUN_DIR/hf/step-N is always whole.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from deeptrace.rundir import layout

from xtrain.train.lifeline import PARENT_PID_ENV

log = logging.getLogger("xtrain")

# The launcher's variables: the export is a process of its own, not a rank of this job.
_JOB_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                  "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "XTRAIN_ERROR_DIR")  # fmt: skip


class BackgroundExports:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._running: tuple[int, subprocess.Popen[bytes]] | None = None

    def start(self, checkpoint: Path, step: int) -> None:
        self.wait_all()
        target = layout.hf_export_dir(self.run_dir, step)
        log_path = layout.logs_dir(self.run_dir) / f"hf-export-step-{step}.log"
        env = {key: value for key, value in os.environ.items() if key not in _JOB_VARIABLES}
        env["OMP_NUM_THREADS"] = "1"  # beside the ranks, not against them
        env["CUDA_VISIBLE_DEVICES"] = ""  # reads files on the CPU; the GPUs stay the ranks'
        env[PARENT_PID_ENV] = str(os.getpid())
        command = [sys.executable, "-m", "xtrain.train.lifeline", "export", str(checkpoint), str(target), "--replace"]
        with log_path.open("ab") as output:
            process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env)
        self._running = (step, process)
        log.info("writing the Hugging Face folder of step %d to %s in the background", step, target)

    def wait_all(self) -> None:
        if self._running is None:
            return
        step, process = self._running
        self._running = None
        code = process.wait()
        if code != 0:
            log.warning("the Hugging Face export of step %d failed (exit code %d): see logs/hf-export-step-%d.log",
                        step, code, step)  # fmt: skip
