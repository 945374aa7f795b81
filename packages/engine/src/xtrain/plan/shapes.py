"""The FSDP groups of a model under a layout, with their sizes on one rank: what the planner's memory and
communication models count.

The groups are those ``xtrain.parallel.fsdp.apply_fsdp`` makes (a test compares them with the real sharded
model's, so a change there fails here): each decoder layer (its non-expert parameters), each MoE layer's routed
experts under expert parallelism (their own group), the input embedding and ``[norm, lm_head]`` for untied
models, and the root (what is left). Sizes come from the model built on the meta device: no memory, any size.

FSDP2 shards each parameter on one dimension (dim 0; the experts' dim 1 under EP) and pads it to a multiple of
the group's ranks, so a rank's shard is ``ceil(dim / ranks)`` rows of every parameter and an all-gather moves the
padded size.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from xtrain.model.config import ModelConfig
from xtrain.model.moe import MoEBlock
from xtrain.model.transformer import Transformer
from xtrain.parallel.layout import ParallelLayout

GroupKind = Literal["layer", "experts", "embedding", "head", "root"]


@dataclass(frozen=True)
class FsdpGroup:
    """One FSDP group as one rank sees it."""

    name: str
    kind: GroupKind
    layer: int | None
    """The decoder layer it belongs to (None: embedding, head, root)."""
    ranks: int
    """Ranks it is sharded over (the dense shard group, or the experts' fsdp ranks)."""
    shard_numel: int
    """Elements this rank holds (padded)."""
    reshard_after_forward: bool

    @property
    def gathered_numel(self) -> int:
        """Elements after the all-gather (padded): what the forward and backward of the group hold unsharded."""
        return self.shard_numel * self.ranks


@functools.lru_cache(maxsize=4)  # read, never changed: one per model for a whole search
def meta_model(model: ModelConfig) -> Transformer:
    """The model on the meta device: shapes without memory (shared: do not change it)."""
    with torch.device("meta"):
        return Transformer(model)


def fsdp_groups(model: ModelConfig, layout: ParallelLayout, *, reshard_after_forward: bool = True) -> list[FsdpGroup]:
    """The FSDP groups of ``model`` under ``layout``, in forward order (embedding, layers, head, root)."""
    return list(_fsdp_groups(model, layout, reshard_after_forward))


@functools.lru_cache(maxsize=64)  # a search asks for the same layouts many times; a meta model takes a while
def _fsdp_groups(model: ModelConfig, layout: ParallelLayout, reshard_after_forward: bool) -> tuple[FsdpGroup, ...]:
    net = meta_model(model)
    dense_ranks, expert_ranks = layout.dense_shard, layout.shard
    assigned: set[int] = set()
    groups: list[FsdpGroup] = []

    def add(name: str, kind: GroupKind, layer: int | None, params: list[nn.Parameter], *, reshard: bool) -> None:
        fresh = [p for p in params if id(p) not in assigned]
        if not fresh:  # FSDP makes no parameter group for a module left without parameters (an untied root)
            return
        assigned.update(id(p) for p in fresh)
        ranks = expert_ranks if kind == "experts" else dense_ranks
        numel = sum(_shard_numel(p, ranks, kind, layout.ep) for p in fresh)
        groups.append(FsdpGroup(name, kind, layer, ranks, numel, reshard))

    layers = list(net.layers)
    for index, layer_module in enumerate(layers):
        reshard = reshard_after_forward and index != len(layers) - 1
        if layout.expert_parallel:
            for block in (m for m in layer_module.modules() if isinstance(m, MoEBlock)):
                add(f"layers.{index}.experts", "experts", index, list(block.experts.parameters()), reshard=reshard)
        add(f"layers.{index}", "layer", index, list(layer_module.parameters()), reshard=reshard)
    if net.lm_head is not None:
        add("embed_tokens", "embedding", None, list(net.embed_tokens.parameters()), reshard=True)
        add("head", "head", None, [*net.norm.parameters(), *net.lm_head.parameters()], reshard=False)
    add("root", "root", None, list(net.parameters()), reshard=reshard_after_forward)
    order = {"embedding": 0, "layer": 1, "experts": 1, "head": 2, "root": 3}
    return tuple(sorted(groups, key=lambda g: (order[g.kind], -1 if g.layer is None else g.layer)))


def _shard_numel(param: nn.Parameter, ranks: int, kind: GroupKind, ep: int) -> int:
    shape = list(param.shape)
    if kind == "experts":  # split over ep on dim 0, then sharded on dim 1 over the fsdp ranks
        shape[0] //= ep
        dim = 1
    else:
        dim = 0
    if not shape:
        shape, dim = [1], 0
    rows = math.ceil(shape[dim] / ranks)
    rest = math.prod(shape) // shape[dim]
    return rows * rest
