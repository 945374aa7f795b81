"""FSDP2 applied to the transformer from outside: one sharding group per decoder layer.

What ``apply_fsdp`` does to the module tree (each group is all-gathered before its forward and backward, and
its gradients reduce-scattered after its backward):

- each decoder layer ``layers.{i}``: its own group; ``reshard_after_forward`` as configured, except the last
  layer, whose parameters the backward needs at once (resharding them would only gather them again);
- ``embed_tokens``: its own group (untied models);
- ``[norm, lm_head]``: one group (untied models), never resharded after forward: the head of
  ``forward_with_head`` reads the output weight after the norm's forward has returned;
- the root (the whole model): what is left (with tied embeddings, the embedding and the final norm; FSDP keeps
  the root unsharded after forward). ``forward_hidden`` and ``forward_with_head`` are registered as forward
  methods, so FSDP's hooks run for them as for ``forward`` (``forward_with_head``'s on the head's output only:
  see ``_register_hiding_router_stats``).

Explicit prefetch: in forward each layer starts the all-gather of the next, in backward of the previous, so the
communication of one layer overlaps the computation of its neighbour. Mixed precision: parameters are cast to
``param_dtype`` for compute, gradients are reduced in ``reduce_dtype``; the sharded master weights and the
optimizer state stay in the dtype the model was built in (fp32).

Expert parallelism (``expert_mesh`` given, after ``apply_expert_parallel``; the meshes of
``xtrain.parallel.mesh.model_meshes``): ``mesh`` is then the mesh over which every non-expert parameter is
sharded (all ranks, or replicate × the ranks of a replica group), and each MoE block's ``experts`` gets its own
group on ``expert_mesh``, the ranks that hold the same experts (fsdp, or replicate × fsdp under HSDP): its
parameters, already sharded on the expert dimension over ep, are sharded on dimension 1 over fsdp (and replicated
over the replicas), and their gradients are reduce-scattered over fsdp (then all-reduced over the replicas).
Those gradients already hold the contributions of every token of the ep group (the all-to-all's backward brought
them), so summing over fsdp and the replicas sums over all ranks' tokens; they are divided by the world size, as
the others are averaged over it (a SUM then a division: gloo lacks PREMUL_SUM). The experts' ``forward_slices``
is registered as a forward method: the expert-parallel schedule calls it once per layer for all its slices, so
each group is gathered once and reduced once.

Gradient reduction averages over the data-parallel ranks (FSDP's default, which gloo supports: gloo lacks the
PREMUL_SUM that a custom divide factor needs). A loss that is already normalised by the global token count must
therefore be multiplied by the data-parallel size before backward; the trainer does that.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor, Shard

from xtrain.model.moe import MoEBlock, RouterStats
from xtrain.model.transformer import ModelOutput, Transformer

REDUCE_DTYPE = torch.float32
"""The dtype gradients are reduced in (``apply_fsdp``'s default; the planner counts with it)."""
EXPERT_FORWARD_METHODS = ("forward_slices",)


def apply_fsdp(
    model: Transformer,
    mesh: DeviceMesh,
    *,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype = REDUCE_DTYPE,
    reshard_after_forward: bool = True,
    prefetch: bool = True,
    expert_mesh: DeviceMesh | None = None,
) -> None:
    """Shard ``model`` in place over ``mesh`` (1-D: FSDP; 2-D replicate × shard: HSDP). Call it on a model built
    on the meta device, before materialising it (see ``xtrain.parallel.materialize``). With ``expert_mesh``
    (expert parallelism), the experts of each MoE block are sharded over it instead."""
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    layers = list(model.layers)
    layer_groups: list[FSDPModule] = []
    for index, layer in enumerate(layers):
        last = index == len(layers) - 1
        if expert_mesh is not None:
            _shard_experts(layer, expert_mesh, policy, reshard_after_forward=reshard_after_forward and not last)
        layer_groups.append(
            fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward and not last)
        )
    embedding: FSDPModule | None = None
    head: FSDPModule | None = None
    if model.lm_head is not None:
        embedding = fully_shard(model.embed_tokens, mesh=mesh, mp_policy=policy, reshard_after_forward=True)
        head_modules: list[nn.Module] = [model.norm, model.lm_head]
        head = fully_shard(head_modules, mesh=mesh, mp_policy=policy, reshard_after_forward=False)[0]
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    _register_hiding_router_stats(
        model,
        "forward_hidden",
        lambda out: (out.hidden, out.router_stats),
        ModelOutput,
    )
    _register_hiding_router_stats(model, "forward_with_head", lambda out: out, lambda head, stats: (head, stats))
    if prefetch:
        _set_prefetch(embedding, layer_groups, head)


def _register_hiding_router_stats(
    model: Transformer,
    name: str,
    split: Callable[[Any], tuple[Any, list[RouterStats]]],
    join: Callable[[Any, list[RouterStats]], Any],
) -> None:
    """Method ``name`` of ``model`` as an FSDP forward method whose hooks see its output without the router
    statistics (``split`` takes them out of the output, ``join`` puts them back).

    FSDP registers a pre-backward hook of the root, and of the head group (whose modules the forward completes
    for it), on every grad-requiring tensor the method returns. The router statistics are such tensors, and
    their gradients arrive layer by layer during the backward. Each arrival then ran the head group's hooks
    again: after the head's own backward they gathered the head once more and kept it gathered to the end, and
    its explicit prefetch gathered the last layer once more after that layer's backward (both held until the
    root's final callback: a layer's and the head's parameters at the peak, and two extra all-gathers per
    micro-batch; torch 2.13 collects the tensors in dataclasses, as RouterStats is). The statistics are handed
    past the hooks instead; each layer's own hooks still see its statistics, as outputs of that layer."""
    compute: Callable[..., Any] = getattr(model, name)
    handed: list[list[RouterStats]] = []

    def without_stats(*args: Any, **kwargs: Any) -> Any:
        output, stats = split(compute(*args, **kwargs))
        handed.append(stats)
        return output

    hooked_name = f"_{name}_without_router_stats"
    setattr(model, hooked_name, without_stats)
    register_fsdp_forward_method(model, hooked_name)
    hooked: Callable[..., Any] = getattr(model, hooked_name)

    def with_stats(*args: Any, **kwargs: Any) -> Any:
        handed.clear()  # nothing left from a call that raised
        output = hooked(*args, **kwargs)
        return join(output, handed.pop())

    setattr(model, name, with_stats)


def _shard_experts(
    layer: nn.Module, expert_mesh: DeviceMesh, policy: MixedPrecisionPolicy, *, reshard_after_forward: bool
) -> None:
    for block in (module for module in layer.modules() if isinstance(module, MoEBlock)):
        experts = block.experts
        if not all(isinstance(param, DTensor) for param in experts.parameters()):
            raise ValueError("apply_fsdp(expert_mesh=...) needs apply_expert_parallel applied to the model first")
        # Dimension 1 (2F, D or F rows): the local experts (dimension 0) may be fewer than the fsdp ranks.
        group = fully_shard(
            experts,
            mesh=expert_mesh,
            mp_policy=policy,
            reshard_after_forward=reshard_after_forward,
            shard_placement_fn=lambda _param: Shard(1),
        )
        world = torch.distributed.get_world_size()
        group.set_gradient_divide_factor(float(world))
        # A SUM then a division (gloo lacks PREMUL_SUM). Not when the reduce-scatter group (the mesh's last
        # dimension; under HSDP the replicas are all-reduced with SUM after it) has one rank: there FSDP issues no
        # reduce-scatter and divides while copying, and with forced sums it would divide a second time (torch 2.13).
        group.set_force_sum_reduction_for_comms(expert_mesh.size(expert_mesh.ndim - 1) > 1)
        for method in EXPERT_FORWARD_METHODS:
            register_fsdp_forward_method(experts, method)


def _set_prefetch(embedding: FSDPModule | None, layers: list[FSDPModule], head: FSDPModule | None) -> None:
    forward_order = [*([embedding] if embedding else []), *layers, *([head] if head else [])]
    for current, following in itertools.pairwise(forward_order):
        current.set_modules_to_forward_prefetch([following])
    backward_order = forward_order[::-1]
    for current, following in itertools.pairwise(backward_order):
        current.set_modules_to_backward_prefetch([following])
