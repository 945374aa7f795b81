"""The learning-rate schedule: linear warmup, then cosine, linear or constant decay to ``optim.min_lr``."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR

from xtrain.config import OptimSection


def lr_at(step: int, optim: OptimSection, max_steps: int) -> float:
    """Learning rate of optimizer step ``step`` (1-based, the step about to be taken)."""
    if optim.warmup_steps and step <= optim.warmup_steps:
        return optim.lr * step / optim.warmup_steps
    if optim.schedule == "constant":
        return optim.lr
    decay_steps = max(1, max_steps - optim.warmup_steps)
    progress = min(1.0, max(0.0, (step - optim.warmup_steps) / decay_steps))
    remaining = 1.0 - progress if optim.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return optim.min_lr + (optim.lr - optim.min_lr) * remaining


def build_scheduler(optimizer: torch.optim.Optimizer, optim: OptimSection, max_steps: int) -> LambdaLR:
    """A LambdaLR whose ``last_epoch`` counts the optimizer steps taken (0 before the first): its learning rate
    is always that of the next step, and its state_dict is what a checkpoint saves."""
    return LambdaLR(optimizer, lambda taken: lr_at(taken + 1, optim, max_steps) / optim.lr)
