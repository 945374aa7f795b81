"""AdamW over the (sharded) parameters, with weight decay on matrices only."""

from __future__ import annotations

import torch
from torch import nn

from xtrain.config import OptimSection


def build_optimizer(model: nn.Module, optim: OptimSection, device: torch.device) -> torch.optim.AdamW:
    """AdamW with decoupled weight decay on parameters of two or more dimensions (matrices, expert stacks,
    embeddings), none on norms and biases. The fused kernel on CUDA, foreach elsewhere; both take FSDP2's
    DTensor parameters, each rank updating its own shard."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for parameter in model.parameters():
        if parameter.requires_grad:
            (decay if parameter.dim() >= 2 else no_decay).append(parameter)
    groups = [
        {"params": decay, "weight_decay": optim.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = device.type == "cuda"
    return torch.optim.AdamW(
        groups, lr=optim.lr, betas=optim.betas, eps=optim.eps, fused=fused, foreach=None if fused else True
    )
