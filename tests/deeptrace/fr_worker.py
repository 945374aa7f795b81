"""Three gloo ranks with PyTorch's Flight Recorder on (TORCH_FR_BUFFER_SIZE); rank 1 skips the 4th all-reduce.

    python fr_worker.py RUN_DIR

The launcher imports torch once and forks the ranks. Ranks 0 and 2 time out in the all-reduce rank 1 never
issued; every rank then dumps its Flight Recorder (torch's own dump, `_dump_fr_trace`, the pickle torch writes on
a timeout) to RUN_DIR/flight_recorder/rank_R, as TORCH_FR_DUMP_TEMP_FILE=RUN_DIR/flight_recorder/rank_ would.
"""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "64")

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace

WORLD = 3


def rank_main(run_dir: Path, rank: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{run_dir}/pg-init", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=3))  # fmt: skip
    tensor = torch.ones(8)
    try:
        for index in range(5):
            if rank == 1 and index == 3:
                continue  # SKIPPED
            dist.all_reduce(tensor)  # ISSUED
    except RuntimeError:
        pass  # the timeout of the all-reduce rank 1 never joined
    out = run_dir / "flight_recorder" / f"rank_{rank}"
    out.parent.mkdir(exist_ok=True)
    out.write_bytes(_dump_fr_trace())


def main() -> None:
    run_dir = Path(sys.argv[1])
    children = []
    for rank in range(WORLD):
        pid = os.fork()
        if pid == 0:
            try:
                rank_main(run_dir, rank)
            finally:
                os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
