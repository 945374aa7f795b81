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
  methods, so FSDP's hooks run for them as for ``forward``.

Explicit prefetch: in forward each layer starts the all-gather of the next, in backward of the previous, so the
communication of one layer overlaps the computation of its neighbour. Mixed precision: parameters are cast to
``param_dtype`` for compute, gradients are reduced in ``reduce_dtype``; the sharded master weights and the
optimizer state stay in the dtype the model was built in (fp32).

Gradient reduction averages over the data-parallel ranks (FSDP's default, which gloo supports: gloo lacks the
PREMUL_SUM that a custom divide factor needs). A loss that is already normalised by the global token count must
therefore be multiplied by the data-parallel size before backward; the trainer does that.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

from xtrain.model.transformer import Transformer

FORWARD_METHODS = ("forward_hidden", "forward_with_head")


def apply_fsdp(
    model: Transformer,
    mesh: DeviceMesh,
    *,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype = torch.float32,
    reshard_after_forward: bool = True,
    prefetch: bool = True,
) -> None:
    """Shard ``model`` in place over ``mesh`` (1-D: FSDP; 2-D replicate × shard: HSDP). Call it on a model built
    on the meta device, before materialising it (see ``xtrain.parallel.materialize``)."""
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    layers = list(model.layers)
    layer_groups: list[FSDPModule] = []
    for index, layer in enumerate(layers):
        last = index == len(layers) - 1
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
    for method in FORWARD_METHODS:
        register_fsdp_forward_method(model, method)
    if prefetch:
        _set_prefetch(embedding, layer_groups, head)


def _set_prefetch(embedding: FSDPModule | None, layers: list[FSDPModule], head: FSDPModule | None) -> None:
    forward_order = [*([embedding] if embedding else []), *layers, *([head] if head else [])]
    for current, following in itertools.pairwise(forward_order):
        current.set_modules_to_forward_prefetch([following])
    backward_order = forward_order[::-1]
    for current, following in itertools.pairwise(backward_order):
        current.set_modules_to_backward_prefetch([following])
