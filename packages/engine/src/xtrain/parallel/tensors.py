"""Writing a full (unsharded) tensor into a parameter that may be sharded.

Checkpoint loading and initialisation produce full tensors one at a time; a parameter may be a plain tensor or a
DTensor shard (after FSDP2). One function serves both, so no caller needs to know which it has. The Hugging Face
I/O of the model core takes these as its ``assign`` and ``gather`` hooks (``load_hf_sharded``, ``save_hf_sharded``),
so the model package itself never touches torch.distributed.
"""

from pathlib import Path

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from xtrain.model.hf import load_hf_into, save_hf
from xtrain.model.transformer import Transformer


@torch.no_grad()
def assign_full(target: Tensor, full: Tensor) -> None:
    """Copy ``full`` (the whole tensor, on any device and dtype) into ``target``; for a DTensor, only this rank's
    shard of it is kept. Every rank must hold the same ``full``: the shard is sliced locally, with no
    communication."""
    if isinstance(target, DTensor):
        # The shard is copied straight out of a view of ``full``, in ``full``'s dtype (copy_ converts): converting
        # the full tensor first, or materialising the shard on its own, would each add one more copy.
        full = full.to(device=target.device)
        local = target.to_local()
        shard = _local_view(full, target)
        if shard is None or shard.shape != local.shape:
            shard = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None).to_local()
        local.copy_(shard)
        return
    target.copy_(full)


def _local_view(full: Tensor, target: DTensor) -> Tensor | None:
    """This rank's shard of ``full`` as a view, for the placements FSDP2 uses (Shard, and Replicate for HSDP):
    DTensor's rule, torch.chunk along the sharded dimension, one mesh dimension after another. None for other
    placements (the caller then asks DTensor itself, at the cost of a copy)."""
    coordinate = target.device_mesh.get_coordinate()
    if coordinate is None:
        return None
    view = full
    for mesh_dim, placement in enumerate(target.placements):
        if type(placement) is Replicate:
            continue
        if type(placement) is not Shard or full.dim() == 0:  # e.g. _StridedShard (FSDP with TP), Partial
            return None
        dim = placement.dim % full.dim()
        chunks = torch.chunk(view, target.device_mesh.size(mesh_dim), dim=dim)
        index = coordinate[mesh_dim]
        # torch.chunk may return fewer chunks than ranks: the ranks past the end hold an empty shard.
        view = chunks[index] if index < len(chunks) else view.narrow(dim, 0, 0)
    return view


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
