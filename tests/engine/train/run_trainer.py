"""Run ``xtrain train``'s trainer in spawned ranks on the debug config and bring back what it trained."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from xtrain.config import TrainConfig, load_train_config
from xtrain.model.transformer import Transformer
from xtrain.train import trainer

from tests.conftest import REPO_ROOT
from tests.engine.parallel.ranks import run_ranks

DEBUG_CONFIG = REPO_ROOT / "examples" / "debug_moe.toml"


def debug_config(cache_dir: Path, *overrides: str) -> tuple[str, ...]:
    """Overrides of examples/debug_moe.toml for a short, exact fp32 run: 3 steps of 128-token packs, the linear
    schedule (which the plain reference loop writes out), no profiler."""
    return (
        "train.max_steps=3",
        "data.pack_tokens=128",
        f"data.cache_dir={cache_dir}",
        'optim.schedule="linear"',
        "optim.warmup_steps=1",
        'parallel.mixed_precision="fp32"',
        "trace.profile_steps=[]",
        *overrides,
    )


def load(overrides: tuple[str, ...]) -> TrainConfig:
    return load_train_config(DEBUG_CONFIG, overrides)


def _full_weights(model: Transformer) -> dict[str, torch.Tensor]:
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _train_rank(overrides: tuple[str, ...], run_dir: str) -> dict[str, torch.Tensor] | None:
    weights = trainer.train(load(overrides), Path(run_dir), finish=_full_weights)
    return weights if os.environ["RANK"] == "0" else None  # cpu_offload: only rank 0 holds them


def train_in_ranks(world_size: int, overrides: tuple[str, ...], run_dir: Path) -> dict[str, torch.Tensor]:
    """Train in ``world_size`` processes; rank 0's full weights after the last step."""
    results = run_ranks(
        world_size, _train_rank, overrides, str(run_dir), tmp_dir=run_dir.parent / f"{run_dir.name}-ipc"
    )
    assert results[0] is not None
    return results[0]
