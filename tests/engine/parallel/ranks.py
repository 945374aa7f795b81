"""Run a function in several real processes on a gloo process group, as torchrun would start them.

Each process gets torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so the code
under test starts its process group exactly as under torchrun. Results come back through a pickle per rank.
"""

from __future__ import annotations

import os
import pickle
import random
import socket
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A port free now and outside the kernel's ephemeral range. A port that the kernel hands out for bind(0) can
    be taken by any outgoing connection (gloo's, a TCPStore client's) before the process group that was meant to
    listen on it starts, seconds later (seen in CI: EADDRINUSE at a rank's TCPStore); outside the range only an
    explicit bind takes it, and the random choice makes two tests meeting on one unlikely."""
    low, high = _ephemeral_range()
    candidates = [port for port in range(20000, 32768) if not low <= port <= high] or list(range(20000, 32768))
    for port in random.sample(candidates, 50):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port outside the ephemeral range")


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
            _entry, args=(world_size, free_port(), str(tmp_dir), fn, args), nprocs=world_size, start_method="spawn"
        )
    except mp.ProcessRaisedException as error:
        errors = sorted(tmp_dir.glob("rank-*.error"))
        detail = errors[0].read_text() if errors else str(error)
        raise AssertionError(f"a rank failed:\n{detail}") from None
    return [pickle.loads(Path(tmp_dir, f"rank-{r}.pkl").read_bytes()) for r in range(world_size)]
