"""Resuming a run in the ranks: which checkpoint (decided once, by rank 0), and restoring every piece of state.

Exactness needs everything that decides the next steps' numbers: the weights and the router's correction bias
(``model.``), AdamW's moments and step counts (``optim.``), the LR schedule, the data position, the skip
counters and each rank's generators. On another world size or HSDP shape DCP reshards the tensors; the data
position does not depend on the world size, so the next step takes exactly the packs it would have taken.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from xtrain.data import PackStream
from xtrain.errors import CheckpointError
from xtrain.model.config import ModelConfig
from xtrain.train.checkpoint.compat import check_fits, saved_shapes
from xtrain.train.checkpoint.locate import ResumePoint, resolve_resume
from xtrain.train.checkpoint.saver import discard_later_checkpoints
from xtrain.train.checkpoint.state import load_state


@dataclass
class ResumeDecision:
    point: ResumePoint | None
    warnings: list[str] = field(default_factory=list)


def decide(resume: str, run_dir: Path, model_config: ModelConfig) -> ResumeDecision:
    """The checkpoint to resume from, checked against the model: CheckpointError naming it otherwise. Reads only."""
    warnings: list[str] = []
    point = resolve_resume(resume, run_dir, warnings.append)
    if point is not None:
        check_fits(point.folder, model_config, saved_shapes(point.folder))
    return ResumeDecision(point, warnings)


def decide_on_all_ranks(resume: str, run_dir: Path, model_config: ModelConfig, rank: int) -> ResumeDecision:
    """Rank 0 decides (one reading of the folder), every rank gets the same answer or the same error. Then rank 0
    removes checkpoints later than the resumed step, before anything else is written."""
    answer: list[Any] = [None]
    if rank == 0:
        try:
            answer[0] = decide(resume, run_dir, model_config)
        except CheckpointError as error:
            answer[0] = error
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(answer, src=0)
    if isinstance(answer[0], CheckpointError):
        raise CheckpointError(str(answer[0]))
    decision: ResumeDecision = answer[0]
    if rank == 0:
        start = decision.point.step if decision.point is not None else 0
        discard_later_checkpoints(run_dir, start, decision.warnings.append)
    if dist.is_initialized():
        dist.barrier()
    return decision


def restore(
    point: ResumePoint,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    stream: PackStream,
    *,
    rank: int,
    device: torch.device,
) -> dict[str, Any]:
    """Load every piece of state of ``point`` into this rank's objects; returns the saved training state
    (``skipped_steps``, ``skipped_in_a_row``...) for the loop's counters."""
    train_state = point.manifest.train_state
    stream.load_state_dict(train_state["data"])  # first: a DataError (other data) before any heavy load
    load_state(
        point.folder,
        model,
        optimizer,
        rank=rank,
        device=device,
        saved_keys=set(saved_shapes(point.folder)),
        process_group=None,
    )
    scheduler.load_state_dict(train_state["scheduler"])
    return train_state
