"""One rank of a small gloo training loop instrumented through the Collector, with a planted problem.

    python watch_worker.py RUN_DIR WORLD SCENARIO CULPRIT [HOSTS]

The launcher imports torch once and forks the WORLD ranks (four torch imports would cost a loaded two-core
machine most of a minute); it waits for them and exits with the first failure. HOSTS (comma-separated, one per
rank) sets each rank's DEEPTRACE_HOST, so one machine stands for several nodes.

Scenarios (the culprit rank does it at step HANG_STEP): block (waits before the all-reduce), data (sleeps in data
loading), missing (all-reduces on another process group, so the world all-reduce misses it), slow (50 ms more per
step, every step, until RUN_DIR/stop exists), checkpoint (a long announced checkpoint phase, then normal steps).
Setting DEEPTRACE_TEST_NODUMP=1 makes the process non-dumpable: ptrace (py-spy) is refused, as in a hardened
container. The culprit touches RUN_DIR/planted when it starts its problem.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from deeptrace.collect import Collector
from deeptrace.spans import Category

HANG_STEP = 3
STEP_S = 0.02
PR_SET_DUMPABLE = 4


def plant(run_dir: Path) -> None:
    (run_dir / "planted").write_text(str(time.time()))


def wait_for_permission(run_dir: Path) -> None:
    plant(run_dir)
    while True:
        time.sleep(0.2)  # HANG-BLOCK


def load_batch(run_dir: Path, stuck: bool) -> torch.Tensor:
    if stuck:
        plant(run_dir)
        time.sleep(3600)  # HANG-DATA
    return torch.ones(64)


def rank_main(run_dir: Path, rank: int, world: int, scenario: str, culprit: int) -> None:
    if os.environ.get("DEEPTRACE_TEST_NODUMP"):
        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{run_dir}/pg-init", rank=rank, world_size=world)
    side = dist.new_group(list(range(world)))
    steps = {"checkpoint": 12, "healthy": 12}.get(scenario, 100_000)
    me = rank == culprit
    with Collector(run_dir, rank, world, heartbeat_interval_s=0.2) as collector:
        for step in range(steps):
            collector.step_begin(step)
            with collector.span("data", Category.DATA):
                batch = load_batch(run_dir, scenario == "data" and me and step == HANG_STEP)
            with collector.span("forward", Category.COMPUTE):
                time.sleep(STEP_S + (0.05 if scenario == "slow" and me else 0.0))
            if scenario == "block" and me and step == HANG_STEP:
                wait_for_permission(run_dir)
            if scenario == "checkpoint" and me and step == HANG_STEP:
                with collector.phase("checkpoint"):
                    plant(run_dir)
                    time.sleep(8.0)  # longer than the watch threshold of the tests
            if scenario == "missing" and me and step == HANG_STEP:
                plant(run_dir)
                with collector.collective("all_reduce", group="side"):
                    dist.all_reduce(batch, group=side)  # SIDE-ALLREDUCE
            with collector.collective("all_reduce", group="world"):
                dist.all_reduce(batch)  # ALLREDUCE
            collector.step_end(step)
            if scenario == "slow" and _stop_requested(run_dir):
                break
    dist.destroy_process_group()


def _stop_requested(run_dir: Path) -> bool:
    """RUN_DIR/stop exists on rank 0, agreed by all ranks (so they all stop after the same step)."""
    flag = torch.tensor([1.0 if (run_dir / "stop").exists() else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def main() -> None:
    run_dir, world, scenario, culprit = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    hosts = sys.argv[5].split(",") if len(sys.argv) > 5 else []
    children = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            if hosts:
                os.environ["DEEPTRACE_HOST"] = hosts[rank]
            try:
                rank_main(run_dir, rank, world, scenario, culprit)
            except BaseException:
                import traceback

                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        children.append(pid)
    failed = 0
    for pid in children:
        _, status = os.waitpid(pid, 0)
        failed = failed or os.waitstatus_to_exitcode(status)
    sys.exit(failed)


if __name__ == "__main__":
    main()
