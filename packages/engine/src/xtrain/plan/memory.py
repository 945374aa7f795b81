"""Per-rank memory of a training step, by part, from the same config, model and layout the trainer uses.

Legend: B bytes; dt the compute dtype's size (2 in bf16, 4 in fp32); T tokens of one pack (one micro-batch);
D hidden size; Q = H·hd and C = KV·hd the query and key/value widths (H heads, KV key/value heads); I the dense
MLP's width; E experts, K of them per token, F an expert's width, S = T·K routed rows; V vocabulary; shard numels
from :mod:`xtrain.plan.shapes`, padded as FSDP2 pads them.

**Where the peak is.** The tensor peak of a step is the largest of four moments, each the sum of what is live
then (measured with ``trace.memory`` and the profiler's memory events, tools/bench/plan_accuracy.py):

- ``backward``: the peak of a decoder layer's backward (the last micro-batch's), the largest over the layers.
  At the last layer every layer's saved activations are still held, its parameters are still gathered and the
  layer below is being gathered ahead of it, and its backward has its first gradients in flight. Lower down
  the saved sets of the layers above are gone, but their sharded gradients have been reduced, the layer
  above's reduce-scatter input is still held, and the layer's own recompute and working set can be larger (a
  dense first layer with a wide MLP): :func:`_earlier_backward_moment`. This is the peak whenever activations
  matter.
- ``reduce_scatter``: the end of the last layer's backward: its saved activations are freed, but its gradients
  are unsharded (dt) and copied into the reduce-scatter's fp32 input, beside its gathered parameters and the
  layer below's. The peak when a layer's parameters outweigh its activations.
- ``loss``: the end of the forward, inside the chunked loss's last chunk: every saved activation, the logits
  chunk and the gradients the loss builds in its forward.
- ``optimizer``: the update: the full gradients and the optimizer's temporaries, no activation. The peak when
  the sharded state dominates (short packs, many parameters per rank).

The parts are those of the moment that peaks (the others are zero there), so ``tensor_peak_bytes`` is their sum:

- ``parameters``: the sharded fp32 master weights, 4 B per element of the rank's shards;
- ``gradients``: their sharded fp32 gradients, 4 B per element. At the optimizer step all of them; during the
  forward and backward of the first micro-batch only those already reduced (the head's, reduced right after
  the loss), of a later micro-batch all of them (accumulated);
- ``optimizer``: AdamW's two fp32 moments, 8 B per element; at the update also the foreach implementation's
  temporary (the square root of the second moments, 4 B per element: the CPU's foreach AdamW; the fused kernel
  on CUDA has none);
- ``fsdp_buffers``: unsharded parameters in dt: the head (never resharded after forward) and, at the ``backward``
  moment, the last layer (never resharded) and, with prefetch, the layer below it (gathered ahead, except the
  groups sharded over one rank: FSDP2 gathers nothing for them and allocates them when they run); at the
  ``loss`` moment the last layer; the groups kept unsharded by ``reshard_after_forward = false`` throughout;
- ``activations``: what forward saved for backward: for a layer that is not checkpointed its full set
  (:func:`layer_activation_bytes_per_token`, counted tensor by tensor from what autograd saves), for a
  checkpointed one its input [T, D] in dt and the routing it saves (top-k values and indices, 12·K B per token;
  under expert parallelism also the exchange tape, about 2·K·T·D); the rotary tables (2·hd·dt per token) and the
  final norm's saved tensors. With offload only ``offload_resident_layers`` inputs stay on the device and the rest
  is host memory (``host_bytes``; on the CPU the host is the device, so they count here). At the ``backward``
  moment also the recompute of the last layer when it is checkpointed (its full set) and that layer's backward
  working set (:func:`backward_working_bytes_per_token`);
- ``loss``: at the ``loss`` moment the chunk's logits (:mod:`xtrain.loss.chunk_size`) and their fp32 gradient,
  the hidden states' gradient [T, D] in dt and the head's fp32 weight gradient [V, D], which the chunked loss
  computes in its forward; at the ``backward`` moment the two gradients (the weight's in dt);
- ``all_to_all``: under expert parallelism, at the ``backward`` moment the send and receive buffers (S and R rows
  of D in dt) of the MoE layer's exchanges in flight beside its experts' backward: the other Domino slices' (two
  at most; none with one slice, :func:`_all_to_all_bytes`);
- ``headroom``: the device's allocator headroom (a fraction of the rest; none on the CPU).

**Routing.** Under expert parallelism a rank's experts compute the rows the other ranks route to them: R per MoE
layer, S = T·K on average but not per rank (a rank whose experts are popular receives more). The receiver's part
of a layer (the rows [R, D], the experts' gate-up [R, 2F] and activation [R, F], the rows' weights and the two
int64 orders that sort them by expert; in backward the SwiGLU's gradients and the gradient exchange's receive
buffer) scales with R. ``expert_rows`` gives R per MoE layer; without it the plan takes uniform routing (R = S),
which is what a planner can know before the run. ``trace.memory`` records the R of every step
(``expert_rows`` in ranks/rank-R.jsonl) and plan_accuracy.py plans each rank with its own.

What the model does not see: the other data-dependent size, a document's attention when the masked-softmax path
materialises its scores, is taken at its per-token value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xtrain.config import TrainConfig
from xtrain.loss.chunk_size import auto_chunk_tokens, chunk_bytes_per_token
from xtrain.model.config import ModelConfig
from xtrain.model.moe.experts import choose_experts_path
from xtrain.parallel.checkpointing import checkpointed_layers
from xtrain.parallel.layout import ParallelLayout
from xtrain.plan.shapes import FsdpGroup

MASTER_BYTES = 4  # fp32 master weights (and their gradients)
ADAM_BYTES = 8  # two fp32 moments
FP32 = 4
INDEX = 8  # int64


@dataclass(frozen=True)
class MemoryPlan:
    parts: dict[str, int]
    """Device bytes by part (the names of the module docstring, headroom included), at the peak's moment."""
    host_bytes: int
    peak_bytes: int
    tensor_peak_bytes: int
    """The peak without the allocator headroom: what ``trace.memory`` measures as ``mem_tensor_peak_bytes``."""
    moment: str = "backward"
    """Where in the step the peak is: ``backward``, ``reduce_scatter``, ``loss`` or ``optimizer``."""


def _norm_bytes(width: int, rows: int, dt: int, *, output_saved: bool) -> int:
    """An RMSNorm of ``width`` over ``rows`` rows per token: its fp32 input (the input itself in fp32, an fp32
    copy otherwise), the normalised values cast back (dt), the fp32 reciprocal root per row, and its output (dt)
    when the next operation saves it (the projections do, the rotary embedding does not)."""
    return (FP32 + dt + (dt if output_saved else 0)) * width + FP32 * rows


def layer_activation_bytes_per_token(
    model: ModelConfig, layer: int, dt: int, *, attention_output_copy: bool = True, fused_experts: bool = False
) -> int:
    """Bytes per token a layer's forward saves for its backward when it is not checkpointed (see docs/plan.md):

    - the attention's input norm (its output is the q, k, v projections' input), q's and k's per-head norms, the
      rotated q and k and v (the attention kernel's inputs), the attention output with its fp32 log-sum-exp per
      head, and on the per-document SDPA path (``attention_output_copy``: CPU and fp32) the o-projection's
      contiguous copy of that output;
    - the MLP's norm (its output is the MLP's input); a dense MLP's gate and up outputs, the SiLU and the product
      (4·I in dt); an MoE block's router (fp32 logits and probabilities, top-k values, indices and their sum,
      log-sum-exp: 8E + 12K + 8 B), the permutation's three int64 index vectors of S rows and the rows' routing
      weights (dt), the dispatched rows [S, D], the experts' gate-up output [S, 2F] and activation [S, F] (dt), and
      the shared experts' MLP (4·F_shared in dt). On the fused CPU path (``fused_experts``, see
      :func:`fused_experts_path`) the experts save only the gate-up output [S, 2F] with the rows' routing weights
      and two int64 index vectors of S rows: the dispatched rows and the activation are recomputed in backward.

    Counted against what autograd saves in a forward of the ``debug`` and ``cpu-moe`` models in fp32 and bf16
    (exact to the byte per token)."""
    d = model.hidden_size
    heads, kv_heads = model.num_attention_heads, model.num_kv_heads
    q, kv = heads * model.head_dim, kv_heads * model.head_dim
    attention = (
        _norm_bytes(d, 1, dt, output_saved=True)
        + _norm_bytes(q, heads, dt, output_saved=False)
        + _norm_bytes(kv, kv_heads, dt, output_saved=False)
        + dt * (q + 2 * kv)  # rotated q and k, and v: the kernel's inputs
        + dt * q
        + FP32 * heads  # the output and its log-sum-exp
        + (dt * q if attention_output_copy else 0)
    )
    ffn_norm = _norm_bytes(d, 1, dt, output_saved=True)
    moe = model.moe
    if moe is not None and model.is_moe_layer(layer):
        k, f, e = moe.num_experts_per_tok, moe.moe_intermediate_size, moe.num_experts
        router = FP32 * 2 * e + (FP32 + INDEX) * k + 2 * FP32
        permutation = (2 if fused_experts else 3) * INDEX * k + dt * k
        experts = dt * k * (2 * f if fused_experts else d + 3 * f)
        shared = dt * 4 * moe.shared_intermediate_size
        mlp = router + permutation + experts + shared
    else:
        mlp = dt * 4 * model.intermediate_size
    return attention + ffn_norm + mlp


def backward_working_bytes_per_token(model: ModelConfig, layer: int, dt: int, *, fused_experts: bool = False) -> int:
    """Bytes per token a layer's backward holds on top of its saved activations at its peak (its MLP's
    backward).

    - An MoE block: dt·(3·D + 4·K·F) on the grouped path (the gradients flowing down and into the block, [T, D]
      each, a [T, D] temporary of the combine's backward, and the SwiGLU's backward on the routed rows: the
      gate-up gradient [S, 2F] and two [S, F] temporaries), one [T, D] more on the fused CPU path (it sums the
      input gradient over experts in a [T, D] buffer and recomputes the gate-up rows one expert at a time).
      Measured on one MoE layer of ``debug`` and ``cpu-moe`` in fp32 (saved-tensor hooks and the profiler's
      memory events): grouped 3,592 and 11,280 B per token (formula 3,584 and 11,264), fused 4,054 and 11,792
      (formula 4,096 and 12,288).
    - A dense MLP: dt·(D + 2·I): the SwiGLU backward's three [T, I] gradients, less the product [T, I] that the
      down projection's backward has released, and the gradient flowing in. Measured at the peak of the first
      (dense) layer's backward with full checkpointing, one process, allocation by allocation: the layer held
      its saved set plus 6,522 B per token on cpu-moe (formula 7,168) and 3,121 on debug (formula 3,584)."""
    moe = model.moe
    if moe is None or not model.is_moe_layer(layer):
        return dt * (model.hidden_size + 2 * model.intermediate_size)
    flows = 4 if fused_experts else 3
    return dt * (flows * model.hidden_size + 4 * moe.num_experts_per_tok * moe.moe_intermediate_size)


def plan_memory(
    config: TrainConfig,
    model: ModelConfig,
    layout: ParallelLayout,
    groups: list[FsdpGroup],
    *,
    dt: int,
    pack_tokens: int,
    headroom: float,
    device_type: str | None = None,
    expert_rows: Sequence[int] | None = None,
) -> MemoryPlan:
    """Per-rank memory of ``config`` on ``model`` under ``layout`` (see the module docstring). ``device_type``
    ``cpu``: the host is the device (offloaded checkpoints count), AdamW runs foreach (one temporary), attention
    takes the per-document SDPA path; None: the CPU when ``headroom`` is 0 (the one device planned without
    allocator headroom, see xtrain.plan.devices), a GPU otherwise. ``expert_rows``: under expert parallelism the
    rows this rank's experts receive per MoE layer, in layer order (default: uniform routing)."""
    on_cpu = device_type == "cpu" if device_type is not None else headroom == 0
    fused = fused_experts_path(config, model, layout, on_cpu=on_cpu)
    rows = ReceivedRows.of(model, layout, pack_tokens, expert_rows)
    shard = sum(group.shard_numel for group in groups)
    micro = max(1, config.train.global_batch // layout.world_size)
    reduced = shard if micro > 1 else sum(g.shard_numel for g in groups if g.kind == "head")
    saved, host = _saved_activations(config, model, rows, dt, pack_tokens, on_cpu=on_cpu, fused=fused)
    state = {"parameters": MASTER_BYTES * shard, "optimizer": ADAM_BYTES * shard}
    zero = {"fsdp_buffers": 0, "activations": 0, "loss": 0, "all_to_all": 0}

    foreach_temporary = FP32 * shard if on_cpu else 0  # fused AdamW on CUDA has none
    optimizer_moment = {
        **state,
        "gradients": MASTER_BYTES * shard,
        **zero,
        "optimizer": ADAM_BYTES * shard + foreach_temporary,
    }
    last_layer = _last_layer_bytes(config, model, rows, dt, pack_tokens, on_cpu=on_cpu, fused=fused)
    gloo = on_cpu and not _last_layer_checkpointed(config, model)  # gloo's buffer of the prefetch in flight
    backward_moment = {
        **state,
        "gradients": MASTER_BYTES * reduced,
        "fsdp_buffers": _fsdp_buffers(groups, dt, prefetch=config.parallel.prefetch, backward=True, gloo=gloo),
        "activations": saved + last_layer,
        "loss": dt * pack_tokens * model.hidden_size + dt * model.vocab_size * model.hidden_size,
        "all_to_all": _all_to_all_bytes(config, model, rows, dt),
    }
    loss_moment = {
        **state,
        "gradients": MASTER_BYTES * (shard if micro > 1 else 0),
        "fsdp_buffers": _fsdp_buffers(groups, dt, prefetch=config.parallel.prefetch, backward=False),
        "activations": saved,
        "loss": _loss_bytes(config, model, dt, pack_tokens),
        "all_to_all": 0,
    }
    last_gathered = _last_layer_gathered(groups)
    reduce_moment = {
        **backward_moment,
        "fsdp_buffers": backward_moment["fsdp_buffers"] + (dt + FP32) * last_gathered,
        "activations": saved
        - _last_layer_saved(config, model, rows, dt, pack_tokens, on_cpu=on_cpu, fused=fused)
        + dt * pack_tokens * model.hidden_size,
        "all_to_all": 0,
    }
    earlier = _earlier_backward_moment(
        config, model, groups, rows, state, dt=dt, tokens=pack_tokens, on_cpu=on_cpu, fused=fused, micro=micro
    )
    if earlier is not None and sum(earlier.values()) > sum(backward_moment.values()):
        backward_moment = earlier
    moments = {
        "backward": backward_moment,
        "reduce_scatter": reduce_moment,
        "loss": loss_moment,
        "optimizer": optimizer_moment,
    }
    moment = max(moments, key=lambda name: sum(moments[name].values()))
    order = ("parameters", "gradients", "optimizer", "fsdp_buffers", "activations", "loss", "all_to_all")
    parts = {name: moments[moment][name] for name in order}
    tensor_peak = sum(parts.values())
    parts["headroom"] = int(headroom * tensor_peak)
    return MemoryPlan(parts, 0 if on_cpu else host, tensor_peak + parts["headroom"], tensor_peak, moment)


def _earlier_backward_moment(
    config: TrainConfig,
    model: ModelConfig,
    groups: list[FsdpGroup],
    rows: ReceivedRows,
    state: dict[str, int],
    *,
    dt: int,
    tokens: int,
    on_cpu: bool,
    fused: bool,
    micro: int,
) -> dict[str, int] | None:
    """The largest of the moments when layer i < L-1 starts its backward (None for a one-layer model).

    Walking down, each layer's backward adds the sharded gradients of the layers above it (reduced) and holds
    the layer above's fp32 reduce-scatter input (FSDP2 keeps it until the next reduce-scatter), while the saved
    activations of the layers above are gone and every group above, those kept gathered after forward
    included, has been resharded after its backward. A layer
    whose recompute and working set are larger than the last one's, such as a dense first layer with a wide
    MLP, can peak there: cpu-moe with full checkpointing peaks in layer 0's MLP backward, with the five MoE
    layers' gradients reduced (profiled allocation by allocation, 1 and 2 processes)."""
    layers = model.num_layers
    if layers < 2:
        return None
    copy = on_cpu or dt == 4
    checkpointed = set(checkpointed_layers(config.memory.checkpointing, layers))
    per_layer_shard = _per_layer(groups, lambda g: g.shard_numel)
    per_layer_gathered = _per_layer(groups, lambda g: g.gathered_numel)
    head_shard = sum(g.shard_numel for g in groups if g.kind == "head")
    all_shard = sum(g.shard_numel for g in groups)
    saved = [
        _layer_saved(model, rows, i, dt=dt, tokens=tokens, checkpointed=checkpointed, copy=copy, fused=fused)
        for i in range(layers)
    ]
    rotary = tokens * 2 * model.rotary_dim * dt
    checkpoint = tokens * model.hidden_size * dt
    # Offload moves every checkpoint but the top checkpointed layer's (xtrain.parallel.offload).
    offloaded = set(checkpointed) - {max(checkpointed)} if config.memory.offload and checkpointed else set()
    best: dict[str, int] | None = None
    for i in range(layers - 1):
        reduced = all_shard if micro > 1 else head_shard + sum(per_layer_shard.get(j, 0) for j in range(i + 1, layers))
        below = 0
        if config.parallel.prefetch and i > 0:
            below = sum(
                g.gathered_numel for g in groups if g.layer == i - 1 and g.ranks > 1 and g.reshard_after_forward
            )
        in_flight = below if (on_cpu and i not in checkpointed) else 0
        # The reduce-scatter input of the layer above (fp32), which FSDP2 holds until the next reduce-scatter.
        # gloo's copy of it lives only while the collective runs, done by the time this layer's MLP backward
        # peaks in the profiled steps: not counted.
        above = per_layer_gathered.get(i + 1, 0)
        held = sum(saved[j] for j in range(i + 1))  # a checkpointed layer's input stays until its backward ends
        if offloaded:
            # Offloaded inputs live in host buffers (until the next forward) and come back as device copies: this
            # layer's and the one prefetched below it. On the CPU the host buffers are the same memory.
            restored = (i in offloaded) + (i - 1 in offloaded)
            host_held = len(offloaded) if on_cpu else 0
            held += checkpoint * (restored + host_held - sum(1 for j in range(i + 1) if j in offloaded))
        recompute = 0
        if i in checkpointed:
            recompute = _layer_saved_bytes(model, i, rows, dt, tokens, copy=copy, fused=fused)
        working = _working_set_bytes(model, rows, i, dt, tokens, fused=fused)
        moment = {
            **state,
            "gradients": MASTER_BYTES * reduced,
            "fsdp_buffers": dt * (per_layer_gathered.get(i, 0) + below + in_flight) + FP32 * above,
            "activations": held + rotary + recompute + working,
            "loss": 0,
            "all_to_all": _all_to_all_bytes(config, model, rows, dt, layer=i),
        }
        if best is None or sum(moment.values()) > sum(best.values()):
            best = moment
    return best


def _per_layer(groups: list[FsdpGroup], numel: Callable[[FsdpGroup], int]) -> dict[int, int]:
    totals: dict[int, int] = {}
    for group in groups:
        if group.layer is not None:
            totals[group.layer] = totals.get(group.layer, 0) + numel(group)
    return totals


def _layer_saved(
    model: ModelConfig,
    rows: ReceivedRows,
    layer: int,
    *,
    dt: int,
    tokens: int,
    checkpointed: set[int],
    copy: bool,
    fused: bool,
) -> int:
    """What layer ``layer``'s forward keeps until its backward: its full saved set, or when checkpointed its input,
    its top-k and under expert parallelism its exchange tape."""
    if layer not in checkpointed:
        return _layer_saved_bytes(model, layer, rows, dt, tokens, copy=copy, fused=fused)
    kept = tokens * model.hidden_size * dt
    moe = model.moe
    if moe is not None and model.is_moe_layer(layer):
        kept += tokens * (FP32 + INDEX) * moe.num_experts_per_tok
        if rows.expert_parallel:
            kept += (rows.sent + rows.received[layer]) * model.hidden_size * dt
    return kept


def _working_set_bytes(model: ModelConfig, rows: ReceivedRows, layer: int, dt: int, tokens: int, *, fused: bool) -> int:
    """A layer's backward working set, the SwiGLU's share following the rows its experts received."""
    working = tokens * backward_working_bytes_per_token(model, layer, dt, fused_experts=fused)
    if rows.expert_parallel and model.moe is not None and model.is_moe_layer(layer):
        working += rows.extra_rows(layer) * dt * 4 * model.moe.moe_intermediate_size
    return working


def fused_experts_path(config: TrainConfig, model: ModelConfig, layout: ParallelLayout, *, on_cpu: bool) -> bool:
    """Whether the MoE blocks take the fused CPU path: ``choose_experts_path``'s run-time choice, with what makes
    the fused loop possible read from the config (the CPU, eager mode: no ``parallel.compile``, whole experts: no
    expert parallelism, GroupedExperts: no GPT-OSS biases) and torch's grouped kernel taken to run (it does on
    the CPU in fp32 and bf16)."""
    moe = model.moe
    fusable = (
        moe is not None
        and on_cpu
        and not config.parallel.compile
        and not layout.expert_parallel
        and not moe.biased_experts
    )
    return fusable and choose_experts_path(config.model.experts_impl, grouped="grouped_mm", fusable=True) == "cpu_fused"


@dataclass(frozen=True)
class ReceivedRows:
    """Where a rank's token rows go under expert parallelism: the rows its experts receive per MoE layer."""

    expert_parallel: bool
    received: dict[int, int]
    """Rows received per MoE layer index (S = T·K each without expert parallelism, or under uniform routing)."""
    sent: int
    """S = T·K: the rows a rank sends per MoE layer, whatever the routing."""

    @classmethod
    def of(
        cls, model: ModelConfig, layout: ParallelLayout, tokens: int, expert_rows: Sequence[int] | None
    ) -> ReceivedRows:
        moe = model.moe
        layers = [i for i in range(model.num_layers) if moe is not None and model.is_moe_layer(i)]
        sent = tokens * moe.num_experts_per_tok if moe is not None else 0
        if expert_rows is None or not layout.expert_parallel:
            return cls(layout.expert_parallel, dict.fromkeys(layers, sent), sent)
        if len(expert_rows) != len(layers):
            raise ValueError(f"expert_rows has {len(expert_rows)} values for the model's {len(layers)} MoE layers")
        return cls(True, dict(zip(layers, expert_rows, strict=True)), sent)

    def extra_rows(self, layer: int) -> int:
        """Rows the layer receives beyond S (negative: fewer)."""
        return self.received.get(layer, self.sent) - self.sent


def _received_row_bytes(model: ModelConfig, dt: int) -> int:
    """What one received row adds to an MoE layer's saved set under expert parallelism: the row [D], the experts'
    gate-up [2F] and activation [F], its routing weight (dt each) and the two int64 orders sorting rows by
    expert."""
    moe = model.moe
    assert moe is not None
    return dt * (model.hidden_size + 3 * moe.moe_intermediate_size + 1) + 2 * INDEX


def _layer_saved_bytes(
    model: ModelConfig, layer: int, rows: ReceivedRows, dt: int, tokens: int, *, copy: bool, fused: bool
) -> int:
    """What a layer that is not checkpointed saves, its received rows counted as routed."""
    uniform = tokens * layer_activation_bytes_per_token(
        model, layer, dt, attention_output_copy=copy, fused_experts=fused
    )
    if not rows.expert_parallel or not model.is_moe_layer(layer):
        return uniform
    return uniform + rows.extra_rows(layer) * _received_row_bytes(model, dt)


def _last_layer_gathered(groups: list[FsdpGroup]) -> int:
    last = max((g.layer for g in groups if g.layer is not None), default=None)
    return sum(g.gathered_numel for g in groups if g.layer is not None and g.layer == last)


def _last_layer_checkpointed(config: TrainConfig, model: ModelConfig) -> bool:
    """Whether the last layer is checkpointed: its backward then starts with its recompute."""
    return model.num_layers - 1 in checkpointed_layers(config.memory.checkpointing, model.num_layers)


def _last_layer_saved(
    config: TrainConfig, model: ModelConfig, rows: ReceivedRows, dt: int, tokens: int, *, on_cpu: bool, fused: bool
) -> int:
    """What the last layer's forward saved (freed by the end of its backward)."""
    last = model.num_layers - 1
    if _last_layer_checkpointed(config, model):
        return tokens * model.hidden_size * dt
    return _layer_saved_bytes(model, last, rows, dt, tokens, copy=on_cpu or dt == 4, fused=fused)


def _fsdp_buffers(groups: list[FsdpGroup], dt: int, *, prefetch: bool, backward: bool, gloo: bool = False) -> int:
    """Gathered parameters held at the moment: the groups kept gathered, the last layer's, under backward prefetch
    the layer below it; with ``gloo`` (the CPU's backend) also the flat output buffer gloo allocates for an
    all-gather on its own thread, as large as the gathered group and held until the collective ends: the
    prefetch in flight at the backward moment, when the last layer's backward starts at once (the caller passes
    ``gloo`` False when that layer is recomputed first: the prefetch's all-gather ends during the recompute).
    Whether it is still alive at the peak depends on timing; the plan counts it, the case a run must fit
    (cpu-moe, 2 processes, 512-token packs: planned 144.6 MiB, measured 140.6 to 148.8 MiB over the ranks of
    three runs, the highest with a block the measurement could not see freed, ``xtrain.loss.peak_memory``)."""
    per_layer = _per_layer(groups, lambda g: g.gathered_numel)
    kept = sum(g.gathered_numel for g in groups if not g.reshard_after_forward and g.layer is None)
    last_index = max(per_layer, default=None)
    last = per_layer[last_index] if last_index is not None else 0
    unresharded = sum(
        g.gathered_numel
        for g in groups
        if g.layer is not None and g.layer != last_index and not g.reshard_after_forward
    )
    below = 0
    if backward and prefetch and last_index is not None:
        # A group sharded over one rank is not gathered ahead: FSDP2 then skips the all-gather and allocates the
        # unsharded parameters only when the layer runs (torch's FSDPParamGroup.unshard / wait_for_unshard).
        below = sum(g.gathered_numel for g in groups if g.layer == last_index - 1 and g.ranks > 1)
        if not all(g.reshard_after_forward for g in groups if g.layer == last_index - 1):
            below = 0  # still gathered from the forward: counted in unresharded
    in_flight = below if gloo else 0
    return dt * (kept + last + below + in_flight + unresharded)


def _saved_activations(
    config: TrainConfig,
    model: ModelConfig,
    rows: ReceivedRows,
    dt: int,
    tokens: int,
    *,
    on_cpu: bool,
    fused: bool,
) -> tuple[int, int]:
    """(device bytes, host bytes) of what forward keeps for backward, at the end of the forward: every layer's
    :func:`_layer_saved`, with offload keeping only ``offload_resident_layers`` inputs on the device."""
    layers = model.num_layers
    checkpointed = set(checkpointed_layers(config.memory.checkpointing, layers))
    checkpoint = tokens * model.hidden_size * dt
    copy = on_cpu or dt == 4  # the per-document SDPA path: CPU, and fp32 anywhere
    saved = sum(
        _layer_saved(model, rows, i, dt=dt, tokens=tokens, checkpointed=checkpointed, copy=copy, fused=fused)
        for i in range(layers)
    )
    host = 0
    if config.memory.offload and checkpointed:
        # The exchange tape and top-k of a checkpointed MoE layer stay on the device; offload moves the input.
        resident = min(config.memory.offload_resident_layers, len(checkpointed))
        host = (len(checkpointed) - 1) * checkpoint  # the top checkpointed layer is never offloaded
        saved -= (len(checkpointed) - resident) * checkpoint
        if on_cpu:
            saved += host  # the host buffers are in the same memory
    rotary = tokens * 2 * model.rotary_dim * dt
    final_norm = tokens * _norm_bytes(model.hidden_size, 1, dt, output_saved=False)
    return saved + rotary + final_norm, host


def _last_layer_bytes(
    config: TrainConfig, model: ModelConfig, rows: ReceivedRows, dt: int, tokens: int, *, on_cpu: bool, fused: bool
) -> int:
    """What the last layer's backward adds when it starts: its recompute when checkpointed, its working set."""
    last = model.num_layers - 1
    copy = on_cpu or dt == 4
    recompute = 0
    if _last_layer_checkpointed(config, model):
        # The recompute saves what the layer's forward saves, on the path it takes (the fused CPU one saves less).
        # Planned with the grouped path's larger set until the CPU peak was kept by address: the phantom layers
        # of gloo's thread had made the fused set look 3-9 % low on 2 processes.
        recompute = _layer_saved_bytes(model, last, rows, dt, tokens, copy=copy, fused=fused)
    return recompute + _working_set_bytes(model, rows, last, dt, tokens, fused=fused)


def _loss_bytes(config: TrainConfig, model: ModelConfig, dt: int, tokens: int) -> int:
    import torch  # noqa: PLC0415

    dtype = torch.bfloat16 if dt == 2 else torch.float32
    setting = config.loss.chunk_tokens
    if isinstance(setting, int):
        chunk = setting
    else:  # "auto": as the trainer picks it
        chunk = auto_chunk_tokens(model.vocab_size, dtype, device=torch.device("cuda" if dt == 2 else "cpu"))
    chunk = min(chunk, tokens)
    logits = chunk * (chunk_bytes_per_token(model.vocab_size, dtype) + FP32 * model.vocab_size)
    gradients = dt * tokens * model.hidden_size + FP32 * model.vocab_size * model.hidden_size
    return logits + gradients


def _all_to_all_bytes(
    config: TrainConfig, model: ModelConfig, rows: ReceivedRows, dt: int, *, layer: int | None = None
) -> int:
    """The exchange rows live beside an MoE layer's experts' backward (the last one's by default): S rows sent and
    R received, D wide, per Domino slice 1/N of them. A slice's experts run their backward after its combine's
    gradient exchange has ended (its rows are then the working set's incoming gradient) and before its
    dispatch's gradient exchange starts, so only the other slices' exchanges are in flight beside them (two at
    most: the next combine, the previous dispatch); with one slice there are none. Measured on debug (ep 2, 2
    and 4 processes) and cpu-moe (ep 2, full checkpointing): counting one slice's buffers put the plan 2-5 % and
    up to 7 % above the steps' peaks; without them they agree within 2.4 %."""
    if not rows.expert_parallel or model.moe is None or not rows.received:
        return 0
    layer = max(rows.received) if layer is None else layer
    if layer not in rows.received:
        return 0
    slices = config.parallel.domino_slices
    overlapping = min(slices - 1, 2)
    return int((rows.sent + rows.received[layer]) * model.hidden_size * dt * overlapping / slices)
