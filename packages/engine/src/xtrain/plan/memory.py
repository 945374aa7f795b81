"""Per-rank memory of a training step, by part, from the same config, model and layout the trainer uses.

What each part counts (B: bytes; dt: the compute dtype's size, 2 in bf16, 4 in fp32; T: tokens of one pack,
one micro-batch; D hidden size; shard numels from :mod:`xtrain.plan.shapes`, padded as FSDP2 pads them):

- ``parameters``: the sharded fp32 master weights, 4 B per element of the rank's shards;
- ``gradients``: their sharded fp32 gradients, 4 B per element (held from the first backward on);
- ``optimizer``: AdamW's two fp32 moments, 8 B per element;
- ``fsdp_buffers``: layers gathered in dt: the largest layer (its experts' group included) twice with prefetch
  (the one computing and the next one arriving), its unsharded gradient before the reduce-scatter, and the
  groups never resharded between forward and backward (the last layer, the head, the root);
- ``activations``: what forward keeps for backward, per layer: a checkpointed layer its input [T, D] (under
  expert parallelism also the exchange tape, about 2·K·T·D, which stays on the device), any other layer its
  full set of saved tensors (:func:`layer_activation_bytes_per_token`); with offload only
  ``offload_resident_layers`` inputs stay on the device; plus the backward's recompute of one checkpointed layer;
- ``offload_host``: not device memory: the checkpoints offload keeps in host memory (``host_bytes``);
- ``loss``: the chunked loss's working set, one chunk of logits (:mod:`xtrain.loss.chunk_size`) plus the
  final hidden states and their gradient;
- ``all_to_all``: under expert parallelism, the send and receive buffers of one MoE layer's dispatch (T·K rows
  of D), for the slices in flight (two at most under Domino);
- ``headroom``: the device's allocator headroom (a fraction of the rest; none on the CPU).

The peak is the sum of the device parts: the parameters, gradients and optimizer state exist throughout; the
activations are at their largest when backward starts, which is where the loss, the last gathered layers and the
first recompute meet. Micro-batches do not add up: each one's backward frees its activations before the next
forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from xtrain.config import TrainConfig
from xtrain.loss.chunk_size import auto_chunk_tokens, chunk_bytes_per_token
from xtrain.model.config import ModelConfig
from xtrain.parallel.checkpointing import checkpointed_layers
from xtrain.parallel.layout import ParallelLayout
from xtrain.plan.shapes import FsdpGroup

MASTER_BYTES = 4  # fp32 master weights (and their gradients)
ADAM_BYTES = 8  # two fp32 moments


@dataclass(frozen=True)
class MemoryPlan:
    parts: dict[str, int]
    """Device bytes by part (the names of the module docstring, headroom included)."""
    host_bytes: int
    peak_bytes: int
    tensor_peak_bytes: int
    """The peak without the allocator headroom: what ``trace.memory`` measures as ``mem_tensor_peak_bytes``."""


def layer_activation_bytes_per_token(model: ModelConfig, layer: int, dt: int) -> int:
    """Bytes per token a layer's forward saves for its backward when it is not checkpointed (see docs/plan.md):
    the norms' inputs and outputs, q, k, v before and after their norms and rotary embedding, the attention
    output with its log-sum-exp, and the MLP's (or the experts') inputs, hidden activations and outputs."""
    d = model.hidden_size
    q = model.num_attention_heads * model.head_dim
    kv = model.num_kv_heads * model.head_dim
    attention = dt * (3 * d + 4 * q + 4 * kv) + 4 * model.num_attention_heads
    moe = model.moe
    if moe is not None and model.is_moe_layer(layer):
        k, f = moe.num_experts_per_tok, moe.moe_intermediate_size
        shared = 4 * moe.shared_intermediate_size
        mlp = dt * (2 * d + 2 * k * d + 4 * k * f + shared) + 8 * moe.num_experts + 12 * k
    else:
        mlp = dt * (2 * d + 4 * model.intermediate_size)
    return attention + mlp


def plan_memory(
    config: TrainConfig,
    model: ModelConfig,
    layout: ParallelLayout,
    groups: list[FsdpGroup],
    *,
    dt: int,
    pack_tokens: int,
    headroom: float,
) -> MemoryPlan:
    """Per-rank memory of ``config`` on ``model`` under ``layout`` (see the module docstring)."""
    shard = sum(group.shard_numel for group in groups)
    activations, host = _activations(config, model, layout, dt, pack_tokens)
    parts = {
        "parameters": MASTER_BYTES * shard,
        "gradients": MASTER_BYTES * shard,
        "optimizer": ADAM_BYTES * shard,
        "fsdp_buffers": _fsdp_buffers(groups, dt, prefetch=config.parallel.prefetch),
        "activations": activations,
        "loss": _loss_bytes(config, model, dt, pack_tokens),
        "all_to_all": _all_to_all_bytes(config, model, layout, dt, pack_tokens),
    }
    tensor_peak = sum(parts.values())
    parts["headroom"] = int(headroom * tensor_peak)
    return MemoryPlan(parts, host, tensor_peak + parts["headroom"], tensor_peak)


def _fsdp_buffers(groups: list[FsdpGroup], dt: int, *, prefetch: bool) -> int:
    per_layer: dict[int, int] = {}
    for group in groups:
        if group.layer is not None:
            per_layer[group.layer] = per_layer.get(group.layer, 0) + group.gathered_numel
    largest = max(per_layer.values(), default=0)
    kept = sum(g.gathered_numel for g in groups if not g.reshard_after_forward and g.layer is None)
    last = per_layer[max(per_layer)] if per_layer else 0
    in_flight = (2 if prefetch else 1) * largest + largest  # gathered layers and one unsharded gradient
    return dt * (in_flight + kept + last)


def _activations(
    config: TrainConfig, model: ModelConfig, layout: ParallelLayout, dt: int, tokens: int
) -> tuple[int, int]:
    """(device bytes, host bytes) of what forward keeps for backward, at the start of backward."""
    layers = model.num_layers
    checkpointed = set(checkpointed_layers(config.memory.checkpointing, layers))
    checkpoint = tokens * model.hidden_size * dt
    moe = model.moe
    tape_rows = 2 * moe.num_experts_per_tok if (moe is not None and layout.expert_parallel) else 0

    # The exchange tape of a checkpointed MoE layer (dispatched and combined rows) stays on the device until the
    # layer's backward; offload moves only the layer's input.
    tapes = sum(tape_rows * checkpoint for i in checkpointed if model.is_moe_layer(i))
    full = sum(tokens * layer_activation_bytes_per_token(model, i, dt) for i in range(layers) if i not in checkpointed)
    inputs = len(checkpointed) * checkpoint
    host = 0
    if config.memory.offload and checkpointed:
        host = inputs
        inputs = min(config.memory.offload_resident_layers, len(checkpointed)) * checkpoint
    recompute = max((tokens * layer_activation_bytes_per_token(model, i, dt) for i in checkpointed), default=0)
    embeddings = 2 * checkpoint  # the embedding output and the final norm's input
    return full + inputs + tapes + recompute + embeddings, host


def _loss_bytes(config: TrainConfig, model: ModelConfig, dt: int, tokens: int) -> int:
    import torch  # noqa: PLC0415

    dtype = torch.bfloat16 if dt == 2 else torch.float32
    setting = config.loss.chunk_tokens
    if isinstance(setting, int):
        chunk = setting
    else:  # "auto": as the trainer picks it
        chunk = auto_chunk_tokens(model.vocab_size, dtype, device=torch.device("cuda" if dt == 2 else "cpu"))
    chunk = min(chunk, tokens)
    hidden = 2 * tokens * model.hidden_size * dt  # the final hidden states and their gradient
    return chunk * chunk_bytes_per_token(model.vocab_size, dtype) + hidden


def _all_to_all_bytes(config: TrainConfig, model: ModelConfig, layout: ParallelLayout, dt: int, tokens: int) -> int:
    if not layout.expert_parallel or model.moe is None:
        return 0
    rows = tokens * model.moe.num_experts_per_tok
    slices = config.parallel.domino_slices
    in_flight = min(slices, 2) / slices
    return int(2 * rows * model.hidden_size * dt * in_flight)
