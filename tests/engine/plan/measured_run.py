"""Train examples/debug_moe.toml with ``trace.memory = true`` in real ranks, with a chosen number of processes per
node (as torchrun tells each rank: LOCAL_WORLD_SIZE), and read back what every rank recorded."""

from __future__ import annotations

import os
from pathlib import Path

from deeptrace.rundir import RankStepRecord, read_rank_records
from xtrain.config import TrainConfig
from xtrain.train import trainer

from tests.engine.parallel.ranks import run_ranks
from tests.engine.train.run_trainer import debug_config, load


def measured_overrides(cache_dir: Path, *overrides: str) -> tuple[str, ...]:
    """2 steps of 128-token packs, fp32, no profiler, spans off, memory traced."""
    return debug_config(cache_dir, "train.max_steps=2", "trace.enabled=false", "trace.memory=true", *overrides)


def _train_rank(overrides: tuple[str, ...], run_dir: str, per_node: int) -> None:
    rank = int(os.environ["RANK"])
    os.environ.update(LOCAL_WORLD_SIZE=str(per_node), LOCAL_RANK=str(rank % per_node))
    trainer.train(load(overrides), Path(run_dir))


def train_measured(
    world_size: int, per_node: int, overrides: tuple[str, ...], run_dir: Path
) -> tuple[TrainConfig, dict[int, list[RankStepRecord]]]:
    """The config and every rank's records of a run of ``world_size`` processes, ``per_node`` per node."""
    run_ranks(
        world_size, _train_rank, overrides, str(run_dir), per_node, tmp_dir=run_dir.parent / f"{run_dir.name}-ipc"
    )
    return load(overrides), read_rank_records(run_dir)
