"""Where a rank's log lines go: logs/rank-R.log for every rank, and the terminal for rank 0."""

from __future__ import annotations

import logging
from pathlib import Path

from deeptrace.rundir import layout

log = logging.getLogger("xtrain")


def setup_logging(run_dir: Path, rank: int) -> None:
    """logs/rank-R.log for every rank; rank 0 also logs to the terminal."""
    path = layout.log_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    log.setLevel(logging.INFO)
    log.propagate = False
    for handler in list(log.handlers):
        log.removeHandler(handler)
    file_handler = logging.FileHandler(path)
    file_handler.setFormatter(logging.Formatter(f"%(asctime)s rank {rank} %(levelname)s %(message)s"))
    log.addHandler(file_handler)
    if rank == 0:
        console = logging.StreamHandler()
        console.setFormatter(logging.Formatter("xtrain: %(message)s"))
        log.addHandler(console)
