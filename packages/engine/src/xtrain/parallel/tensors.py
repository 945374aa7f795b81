"""Writing a full (unsharded) tensor into a parameter that may be sharded.

Checkpoint loading and initialisation produce full tensors one at a time; a parameter may be a plain tensor or a
DTensor shard (after FSDP2). One function serves both, so no caller needs to know which it has. The Hugging Face
I/O of the model core takes these as its ``assign`` and ``gather`` hooks (``load_hf_sharded``, ``save_hf_sharded``),
so the model package itself never touches torch.distributed.
"""

from pathlib import Path

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, distribute_tensor

from xtrain.model.hf import load_hf_into, save_hf
from xtrain.model.transformer import Transformer


@torch.no_grad()
def assign_full(target: Tensor, full: Tensor) -> None:
    """Copy ``full`` (the whole tensor, on any device and dtype) into ``target``; for a DTensor, only this rank's
    shard of it is kept. Every rank must hold the same ``full``: the shard is sliced locally, with no
    communication."""
    if isinstance(target, DTensor):
        full = full.to(device=target.device, dtype=target.dtype)
        shard = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None)
        target.to_local().copy_(shard.to_local())
        return
    target.copy_(full)


def full_tensor(tensor: Tensor) -> Tensor:
    """The whole tensor: gathered from the shards of a DTensor (a collective: every rank must call it), or
    ``tensor`` itself."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def load_hf_sharded(model: Transformer, path: Path) -> None:
    """Load a Hugging Face folder into a (sharded) model: each rank reads one tensor at a time and keeps its shard."""
    load_hf_into(model, path, assign=assign_full)


def save_hf_sharded(model: Transformer, path: Path) -> None:
    """Write a (sharded) model as a Hugging Face folder: every rank gathers one layer at a time, rank 0 writes.
    Every rank must call it."""
    rank0 = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    save_hf(model, path, gather=full_tensor, write=rank0)
