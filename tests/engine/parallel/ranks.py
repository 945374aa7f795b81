"""Run a function in several real processes on a gloo process group, as torchrun would start them.

Each process gets torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so the code
under test starts its process group exactly as under torchrun. Results come back through a pickle per rank.
"""

from __future__ import annotations

import os
import pickle
import socket
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _entry(  # noqa: PLR0917 (torch.multiprocessing passes these positionally)
    rank: int, world_size: int, port: int, out_dir: str, fn: Callable[..., Any], args: tuple[Any, ...]
) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    import torch

    torch.set_num_threads(1)
    try:
        result = fn(*args)
    except BaseException:
        Path(out_dir, f"rank-{rank}.error").write_text(traceback.format_exc())
        raise
    Path(out_dir, f"rank-{rank}.pkl").write_bytes(pickle.dumps(result))


def run_ranks(world_size: int, fn: Callable[..., Any], *args: Any, tmp_dir: Path) -> list[Any]:
    """``fn(*args)`` in ``world_size`` spawned processes; returns each rank's result, in rank order."""
    tmp_dir.mkdir(parents=True, exist_ok=True)
    try:
        mp.start_processes(
            _entry, args=(world_size, _free_port(), str(tmp_dir), fn, args), nprocs=world_size, start_method="spawn"
        )
    except mp.ProcessRaisedException as error:
        errors = sorted(tmp_dir.glob("rank-*.error"))
        detail = errors[0].read_text() if errors else str(error)
        raise AssertionError(f"a rank failed:\n{detail}") from None
    return [pickle.loads(Path(tmp_dir, f"rank-{r}.pkl").read_bytes()) for r in range(world_size)]
