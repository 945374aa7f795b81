"""Resuming a run in the ranks: which checkpoint (decided once, by rank 0), and restoring every piece of state.

Exactness needs every part of :class:`.parts.TrainingParts` (the weights and router bias, AdamW's moments, the
schedule, the data position, the counters, each rank's generators). On another world size or HSDP shape DCP
reshards the tensors; the data position does not depend on the world size, so the next step takes exactly the
packs it would have taken.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from xtrain.errors import CheckpointError
from xtrain.model.config import ModelConfig
from xtrain.train.checkpoint.compat import check_fits, saved_shapes
from xtrain.train.checkpoint.locate import ResumePoint, resolve_resume
from xtrain.train.checkpoint.parts import RNG_PREFIX, Checkpointed, TrainingParts
from xtrain.train.checkpoint.saver import discard_later_checkpoints, set_aside_corrupted


@dataclass
class ResumeDecision:
    point: ResumePoint | None
    warnings: list[str] = field(default_factory=list)
    corrupted: list[Path] = field(default_factory=list)
    """Complete checkpoints newer than ``point`` whose files do not verify (``--resume auto`` fell back)."""


def decide(resume: str, run_dir: Path, model_config: ModelConfig) -> ResumeDecision:
    """The checkpoint to resume from, verified and checked against the model: CheckpointError naming it
    otherwise. Reads only."""
    warnings: list[str] = []
    corrupted: list[Path] = []
    point = resolve_resume(resume, run_dir, warnings.append, corrupted)
    if point is not None:
        check_fits(point.folder, model_config, saved_shapes(point.folder))
    return ResumeDecision(point, warnings, corrupted)


def decide_on_all_ranks(resume: str, run_dir: Path, model_config: ModelConfig, rank: int) -> ResumeDecision:
    """Rank 0 decides (one reading of the folder), every rank gets the same answer or the same error. Then rank 0
    sets aside the corrupted checkpoints it fell back from and removes the other checkpoints later than the
    resumed step, before anything else is written."""
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
        set_aside_corrupted(decision.corrupted, decision.warnings.append)
        discard_later_checkpoints(run_dir, start, decision.warnings.append)
    if dist.is_initialized():
        dist.barrier()
    return decision


def restore(point: ResumePoint, parts: TrainingParts) -> None:
    """Load every part's state of ``point`` into this rank's objects, resharded to this run's mesh."""
    train_state = point.manifest.train_state
    parts.data.load_state_dict(train_state.data)  # first: a DataError (other data) before any heavy load
    load_device_state(point.folder, parts, set(saved_shapes(point.folder)))
    parts.load_host_state(train_state)


def load_device_state(folder: Path, parts: Checkpointed, saved_keys: set[str]) -> bool:
    """DCP's load of the model, the optimizer and this rank's generators (when the checkpoint has them: a rank
    beyond the saving world keeps its seeded ones). Returns whether this rank's generators were restored."""
    own_rng = parts.rng.expect(saved_keys)
    state = parts.device_state()
    if not own_rng:
        del state[RNG_PREFIX]
    dcp_load(state, checkpoint_id=folder)
    return own_rng
