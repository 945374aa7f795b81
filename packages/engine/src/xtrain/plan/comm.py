"""The bytes one rank sends in one optimizer step, per collective kind, split into links inside its node and
links between nodes: what xtrain's training step issues, counted from the model, the config and the layout.

What a rank "sends" in each kind of collective, and which link a byte takes, is the convention of
:mod:`xtrain.parallel.comm_volume` (ring all-gather: (n - 1)·input; ring reduce-scatter: (n - 1)/n of the input;
all-reduce: 2(n - 1)/n of the tensor; all-to-all: the rows sent to other ranks, not those a rank keeps; every
piece counted on the link to the peer it is for, inside the node when that peer's ``rank // processes_per_node``
is this rank's). ``trace.memory = true`` makes ``xtrain train`` count the collectives it actually issues with the
same functions (``comm_bytes`` in ranks/rank-R.jsonl), which is how this model is tested.

What one step issues, per micro-batch (``train.global_batch / world_size`` of them, one pack of ``pack_tokens``
each), for the FSDP groups of :func:`xtrain.plan.shapes.fsdp_groups` (those of ``xtrain.parallel.fsdp``):

- **all-gather** of each group's padded shard (dim 0, or the experts' dim 1, padded to a multiple of the group's
  ranks) in ``param_dtype``, over its shard ranks: once in forward, and once more in backward for a group that
  is resharded after forward (every decoder layer but the last when ``parallel.reshard_after_forward``, the root
  then too, and the embedding always; the head group stays gathered). Prefetch changes when, not how much. (The
  router statistics are outputs of every MoE layer; ``xtrain.parallel.fsdp`` keeps them away from the root's and
  the head group's hooks, which would otherwise gather the head and the last layer once more in backward.)
- **reduce-scatter** of each group's gradients, ranks × the padded shard in ``reduce_dtype`` (fp32), over the
  same ranks: once per micro-batch (the step does not turn gradient sync off between micro-batches);
- **all-reduce** under HSDP (``parallel.replicate`` > 1): each group's reduced shard across the replicas, once
  per micro-batch; and the step's own: under MoE the router's counts per micro-batch ([MoE layers, E] float64
  over all ranks), then at the update the two logged losses (float64), the router's probability sums ([MoE
  layers, E] float64) and the gradient norm (DTensor's: per mesh, one element per gradient, in the gradients'
  dtype, all-reduced over the dimensions the mesh shards over: the replica group, for the dense parameters as
  for the experts, whose fsdp × ep dimensions are reduced together);
- **all-to-all** under expert parallelism, per MoE layer: the split sizes ([ep, domino_slices, E/ep] int64, one
  row to each rank of the ep group) and the token rows: dispatched (D + 1 columns: the routing weight travels
  as a column) and combined (D columns), and the gradients of both in backward, in ``param_dtype``. Routing
  depends on the data: the plan takes its expectation under uniform routing (each of a token's K slots goes to
  each ep rank with probability 1/ep, and each rank receives as many rows as it sends), so a step's measured
  figure differs by how unbalanced that step's routing was. Recomputing a checkpointed layer replays its
  exchanges and sends nothing.

Everything but the all-to-all depends only on the model, the layout, the dtype, the rank and the two FSDP
switches, so it is computed once per such combination (a search plans thousands of candidates on a few
layouts); each collective's bytes come from the group's size and its ranks on this rank's node, counted in
closed form (the groups are ranges of ranks), with the same rounding as the per-peer convention.

Not counted: checkpoint saves, the data pipeline's start-up, and collectives of other kinds (barriers,
broadcasts), as the measurement does not count them either.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from xtrain.config import TrainConfig
from xtrain.model.config import ModelConfig
from xtrain.model.moe import MoEBlock
from xtrain.parallel.comm_volume import (
    KINDS,
    NOTHING,
    LinkBytes,
    all_gather_bytes,
    all_reduce_bytes,
    reduce_scatter_bytes,
    uniform_all_to_all_bytes,
)
from xtrain.parallel.fsdp import REDUCE_DTYPE
from xtrain.parallel.layout import ParallelLayout
from xtrain.plan.shapes import FsdpGroup, fsdp_groups, meta_model

__all__ = ["KINDS", "LinkBytes", "RankGroups", "comm_bytes_per_step"]

_COUNT_BYTES = 8  # the router's counts and probability sums are float64, the split sizes int64
_LOSS_BYTES = 2 * 8  # the step's logged [cross-entropy, z-loss], float64


def comm_bytes_per_step(
    config: TrainConfig,
    model: ModelConfig,
    layout: ParallelLayout,
    pack_tokens: int | None = None,
    micro_batches: int | None = None,
    *,
    rank: int = 0,
    device_type: str = "cuda",
) -> dict[str, LinkBytes]:
    """Bytes ``rank`` sends in one optimizer step, per kind of :data:`KINDS` (see the module docstring).

    ``pack_tokens`` and ``micro_batches`` default to ``data.pack_tokens`` and ``train.global_batch /
    world_size``; ``device_type`` decides ``parallel.mixed_precision = "auto"`` as the trainer does (bf16 on
    CUDA, fp32 on the CPU)."""
    from xtrain.train.build import compute_dtype  # noqa: PLC0415 (the trainer's rule; heavy to import)

    tokens = config.data.pack_tokens if pack_tokens is None else pack_tokens
    micro = config.train.global_batch // layout.world_size if micro_batches is None else micro_batches
    param_bytes = compute_dtype(config, torch.device(device_type)).itemsize
    parallel = config.parallel
    fixed = _fixed_bytes(model, layout, rank, param_bytes, parallel.reshard_after_forward)
    per_micro = dict(fixed.per_micro)
    if layout.expert_parallel:
        per_micro["all_to_all"] = _exchanges(
            fixed.moe_blocks,
            RankGroups(layout, rank),
            tokens=tokens,
            hidden=model.hidden_size,
            slices=parallel.domino_slices,
            param_bytes=param_bytes,
        )
    total = {kind: per_micro[kind] * micro for kind in KINDS}
    total["all_reduce"] += fixed.per_step_all_reduce
    return total


@dataclass(frozen=True)
class _FixedBytes:
    """What a step sends that depends neither on the tokens nor on the micro-batches."""

    per_micro: tuple[tuple[str, LinkBytes], ...]
    """Per micro-batch, by kind: FSDP's collectives, HSDP's all-reduce and the router's counts (no all-to-all)."""
    per_step_all_reduce: LinkBytes
    """Once per step: the logged losses, the router's probability sums and the gradient norm."""
    moe_blocks: tuple[tuple[tuple[int, int], int], ...]
    """The MoE blocks' (experts, experts per token), with how many blocks have them."""


@functools.lru_cache(maxsize=256)  # a search plans thousands of candidates on a few layouts
def _fixed_bytes(
    model: ModelConfig, layout: ParallelLayout, rank: int, param_bytes: int, reshard_after_forward: bool
) -> _FixedBytes:
    ranks = RankGroups(layout, rank)
    groups = fsdp_groups(model, layout, reshard_after_forward=reshard_after_forward)
    experts = _moe_experts(model)
    per_micro = _fsdp(groups, ranks, param_bytes)
    counts = sum(num_experts for num_experts, _ in experts) * _COUNT_BYTES
    if experts:
        per_micro["all_reduce"] += ranks.sent("all_reduce", counts, ranks.world)
    per_step = ranks.sent("all_reduce", _LOSS_BYTES + counts * bool(experts), ranks.world)
    per_step += _grad_norm(model, ranks)
    return _FixedBytes(tuple(per_micro.items()), per_step, tuple(Counter(experts).items()))


@functools.lru_cache(maxsize=8)
def _moe_experts(model: ModelConfig) -> tuple[tuple[int, int], ...]:
    """Each MoE block's (experts, experts per token), in module order."""
    blocks = (module for module in meta_model(model).modules() if isinstance(module, MoEBlock))
    return tuple((block.config.num_experts, block.config.num_experts_per_tok) for block in blocks)


@dataclass(frozen=True)
class RankGroups:
    """The groups (global ranks) one rank takes part in under a layout (rank r = (i·shard + f)·ep + e)."""

    layout: ParallelLayout
    rank: int

    @property
    def world(self) -> range:
        return range(self.layout.world_size)

    @property
    def dense_shard(self) -> range:
        """The replica group's ranks: FSDP's shard ranks of every non-expert parameter."""
        size = self.layout.dense_shard
        first = self.rank // size * size
        return range(first, first + size)

    @property
    def replicas(self) -> range:
        """The ranks holding the same shards in the other replica groups (HSDP's all-reduce)."""
        size = self.layout.dense_shard
        return range(self.rank % size, self.layout.replicate * size, size)

    @property
    def expert_shard(self) -> range:
        """The ranks holding the same experts inside the replica group (the experts' FSDP ranks)."""
        ep, first = self.layout.ep, self.rank // self.layout.dense_shard * self.layout.dense_shard
        return range(first + self.rank % ep, first + self.layout.shard * ep, ep)

    @property
    def ep_group(self) -> range:
        """The ranks exchanging tokens with this one (consecutive)."""
        first = self.rank // self.layout.ep * self.layout.ep
        return range(first, first + self.layout.ep)

    def sent(self, kind: str, nbytes: int, group: Sequence[int]) -> LinkBytes:
        """This rank's bytes in one collective of ``kind`` of ``nbytes`` (the input; an all-gather's per rank)."""
        per_node = self.layout.processes_per_node
        if kind == "all_gather":
            return all_gather_bytes(nbytes, group, self.rank, per_node)
        if kind == "reduce_scatter":
            return reduce_scatter_bytes(nbytes, group, self.rank, per_node)
        return all_reduce_bytes(nbytes, group, self.rank, per_node)


def _fsdp(groups: list[FsdpGroup], ranks: RankGroups, param_bytes: int) -> dict[str, LinkBytes]:
    """One micro-batch's FSDP collectives (see the module docstring)."""
    reduce_bytes = REDUCE_DTYPE.itemsize
    expert_shard, dense_shard, replicas = ranks.expert_shard, ranks.dense_shard, ranks.replicas
    sent = dict.fromkeys(KINDS, NOTHING)
    for group in groups:
        shard = expert_shard if group.kind == "experts" else dense_shard
        gathers = 2 if group.reshard_after_forward else 1
        sent["all_gather"] += ranks.sent("all_gather", group.shard_numel * param_bytes, shard) * gathers
        sent["reduce_scatter"] += ranks.sent("reduce_scatter", group.gathered_numel * reduce_bytes, shard)
        if ranks.layout.replicate > 1:
            sent["all_reduce"] += ranks.sent("all_reduce", group.shard_numel * reduce_bytes, replicas)
    return sent


def _exchanges(
    blocks: tuple[tuple[tuple[int, int], int], ...],
    ranks: RankGroups,
    *,
    tokens: int,
    hidden: int,
    slices: int,
    param_bytes: int,
) -> LinkBytes:
    """One micro-batch's all-to-alls under expert parallelism, expected under uniform routing (``blocks``: each
    (experts, experts per token) with how many MoE blocks have it)."""
    group, per_node = ranks.ep_group, ranks.layout.processes_per_node
    sent = NOTHING
    for (num_experts, top_k), count in blocks:
        split_sizes = slices * (num_experts // len(group)) * _COUNT_BYTES
        block = uniform_all_to_all_bytes(split_sizes, group, ranks.rank, per_node)
        # Per destination: tokens·K/ep rows each way, dispatched (D + 1) and combined (D), and their gradients.
        rows = tokens * top_k / len(group)
        row_bytes = round(rows * (2 * (hidden + 1) + 2 * hidden) * param_bytes)
        block += uniform_all_to_all_bytes(row_bytes, group, ranks.rank, per_node)
        sent += block * count
    return sent


@functools.lru_cache(maxsize=8)
def _gradient_bytes(model: ModelConfig, expert_parallel: bool) -> tuple[int, int]:
    """One element per gradient, in its dtype: (the dense mesh's, the experts' mesh's; 0 without EP)."""
    net = meta_model(model)
    experts = {id(p) for m in net.modules() if isinstance(m, MoEBlock) for p in m.experts.parameters()}
    if not expert_parallel:
        experts = set()
    params = list(net.parameters())
    dense = sum(p.element_size() for p in params if id(p) not in experts)
    return dense, sum(p.element_size() for p in params if id(p) in experts)


def _grad_norm(model: ModelConfig, ranks: RankGroups) -> LinkBytes:
    """The gradient norm's all-reduces: one element per gradient of each mesh, over its sharded dimensions (the
    replica group for both meshes)."""
    dense_bytes, expert_bytes = _gradient_bytes(model, ranks.layout.expert_parallel)
    sent = ranks.sent("all_reduce", dense_bytes, ranks.dense_shard)
    if expert_bytes:  # sharded over fsdp × ep: one all-reduce over both, the replica group
        sent += ranks.sent("all_reduce", expert_bytes, ranks.dense_shard)
    return sent
