"""One optimizer step: this rank's micro-batches, losses normalised over the global batch, backward, update.

Shape legend: T tokens of a pack, D hidden size, V vocabulary, L MoE layers, E experts.

How the losses keep their global-batch meaning (every rank runs ``global_batch / dp`` packs one at a time):

- Cross-entropy: each micro-batch's summed token loss is divided by the number of target tokens of the WHOLE
  step (all micro-batches, all ranks), known from the packs before any forward. The shares add up to the mean
  over the global batch, so 1 process × 4 packs, 2 × 2 and 4 × 1 give the same loss and gradients.
- Router z-loss: a sum over tokens divided by the global token count: exact in the same way.
- Load-balancing loss ``E · Σ_e c_e · P_e / N²`` (c: top-k counts, P: summed router probabilities, both over
  the global batch): only P carries gradient, but c must be known when a micro-batch runs its backward, and
  later micro-batches have not run yet. What is approximated, precisely: at micro-step m (of M), the gradient
  uses as c the counts of micro-steps 1..m summed over all ranks, times M/m (the estimate of the step's counts
  from what has been routed so far, as in Qiu et al. 2025's global-batch balancing). With one micro-step per
  rank (global_batch = dp) this is exact. The logged ``aux_loss`` is always the exact global-batch value,
  computed after the step from the final counts and probabilities.
- FSDP averages gradients over the data-parallel ranks, so the loss is multiplied by the data-parallel size
  before backward (gloo lacks the PREMUL_SUM a custom divide factor needs).

A step whose loss or gradient norm is not finite changes no weight (gradients dropped, optimizer not stepped).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from deeptrace.collect import Collector
from deeptrace.spans import Category
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from xtrain.data import Pack
from xtrain.loss import chunked_cross_entropy
from xtrain.model.documents import PackedDocuments
from xtrain.model.moe import MoEBlock, RouterStats, update_expert_bias
from xtrain.model.moe.aux_loss import load_balancing_loss, router_z_loss
from xtrain.model.transformer import Transformer


@dataclass(frozen=True)
class LossSettings:
    """What the step needs to know about the losses."""

    chunk_tokens: int
    aux_loss_coef: float
    z_loss_coef: float
    max_grad_norm: float


@dataclass(frozen=True)
class GlobalBatch:
    """Counts over the packs of the whole step (every rank's), known before any forward."""

    target_tokens: int
    """Tokens with a label (the cross-entropy normaliser)."""
    routed_tokens: int
    """Tokens through the model (the router losses' normaliser)."""

    @classmethod
    def of(cls, packs: Sequence[Pack]) -> GlobalBatch:
        return cls(
            target_tokens=sum(pack.num_loss_tokens for pack in packs),
            routed_tokens=sum(len(pack.input_ids) for pack in packs),
        )


@dataclass(frozen=True)
class StepResult:
    loss: float
    """Cross-entropy over the global batch (mean per target token)."""
    aux_loss: float
    """Load-balancing loss of the global batch (before its coefficient; 0 for a dense model)."""
    z_loss: float
    """Router z-loss of the global batch (before its coefficient)."""
    grad_norm: float
    """Global gradient norm before clipping."""
    skipped: bool
    """The loss or gradient was not finite: no weight changed."""


@dataclass(frozen=True)
class MicroBatch:
    input_ids: Tensor
    """[1, T] token ids of one pack."""
    labels: Tensor
    """[T] the token each position predicts, -100 where none."""
    documents: PackedDocuments

    @classmethod
    def from_pack(cls, pack: Pack, device: torch.device) -> MicroBatch:
        lengths = np.diff(pack.cu_seqlens).tolist()
        return cls(
            input_ids=torch.from_numpy(pack.input_ids).to(device, non_blocking=True).unsqueeze(0),
            labels=torch.from_numpy(pack.labels).to(device, non_blocking=True),
            documents=PackedDocuments.from_lengths(lengths, device),
        )


@dataclass(frozen=True)
class _StepContext:
    """What is the same for every micro-batch of a step."""

    global_batch: GlobalBatch
    settings: LossSettings
    dp_size: int
    num_micro: int
    collector: Collector | None
    stats_group: dist.ProcessGroup | None


@dataclass
class _Accumulated:
    """What this rank's micro-batches add up to before the update (device tensors, no host read)."""

    logged: Tensor
    """[cross-entropy share, z-loss share], summed over the micro-batches."""
    counts: Tensor | None = None
    """[L, E] tokens routed to each expert of each MoE layer, summed over all ranks, so far."""
    prob_sums: Tensor | None = None
    """[L, E] router probabilities summed over this rank's tokens (all ranks' after the step's reduction)."""


def train_step(
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[MicroBatch],
    global_batch: GlobalBatch,
    settings: LossSettings,
    *,
    dp_size: int,
    collector: Collector | None = None,
    stats_group: dist.ProcessGroup | None = None,
) -> StepResult:
    """Forward and backward of this rank's micro-batches, then clip and update (unless not finite).

    With a ``collector``, the forward, backward and optimizer phases are recorded as deeptrace spans.
    ``stats_group``: the ranks whose tokens make the global batch, over which the router counts, probabilities
    and logged losses are summed (None: all ranks). Under expert parallelism that is still every rank: the ranks
    of an ep group route different tokens (each counts its own tokens, not the rows its experts receive)."""
    device = micro_batches[0].input_ids.device
    context = _StepContext(global_batch, settings, dp_size, len(micro_batches), collector, stats_group)
    acc = _Accumulated(logged=torch.zeros(2, dtype=torch.float64, device=device))
    for index, batch in enumerate(micro_batches):
        _forward_backward(model, batch, index, context, acc)
    with _spans(collector)("optimizer", Category.OPTIMIZER):
        return _update(model, optimizer, acc, context)


def _forward_backward(
    model: Transformer, batch: MicroBatch, index: int, context: _StepContext, acc: _Accumulated
) -> None:
    """Micro-batch ``index`` of the step: its losses (global-batch normalised) and their backward."""
    global_batch, settings = context.global_batch, context.settings
    span = _spans(context.collector)
    with span("forward", Category.COMPUTE):
        ce, stats = model.forward_with_head(
            batch.input_ids, documents=batch.documents, head=_loss_head(batch, global_batch, settings)
        )
    loss = ce
    if stats:
        with _collectives(context.collector)("all_reduce expert counts"):
            counts_LE = torch.stack([s.tokens_per_expert for s in stats]).to(torch.float64)
            counts_LE = _all_reduce_sum(counts_LE, context.stats_group)
        acc.counts = counts_LE if acc.counts is None else acc.counts + counts_LE
        estimate_LE = acc.counts * (context.num_micro / (index + 1))
        balance = load_balancing_loss(stats, estimate_LE, global_batch.routed_tokens)
        z = router_z_loss(stats, global_num_tokens=global_batch.routed_tokens)
        loss = loss + settings.aux_loss_coef * balance + settings.z_loss_coef * z
        detached_prob_LE = _prob_sums(stats)
        acc.prob_sums = detached_prob_LE if acc.prob_sums is None else acc.prob_sums + detached_prob_LE
        acc.logged[1] += z.detach().double()
    acc.logged[0] += ce.detach().double()
    with span("backward", Category.COMPUTE):
        (loss * context.dp_size).backward()  # type: ignore[no-untyped-call]  # torch's backward is untyped


def _loss_head(
    batch: MicroBatch, global_batch: GlobalBatch, settings: LossSettings
) -> Callable[[Tensor, Tensor], Tensor]:
    """The chunked cross-entropy of ``batch``, normalised by the target tokens of the whole ``global_batch``."""

    def head(hidden_TD: Tensor, weight_VD: Tensor) -> Tensor:
        return chunked_cross_entropy(
            hidden_TD,
            weight_VD,
            batch.labels,
            normaliser=global_batch.target_tokens,
            chunk_tokens=settings.chunk_tokens,
        )

    return head


def evaluation_loss(model: Transformer, batch: MicroBatch, global_batch: GlobalBatch, settings: LossSettings) -> Tensor:
    """``batch``'s share of the cross-entropy of ``global_batch`` (the head training uses), for evaluation: call it
    with gradients off. The router's statistics are not used: no auxiliary loss, no bias update."""
    ce, _stats = model.forward_with_head(
        batch.input_ids, documents=batch.documents, head=_loss_head(batch, global_batch, settings)
    )
    return ce


def _update(
    model: Transformer, optimizer: torch.optim.Optimizer, acc: _Accumulated, context: _StepContext
) -> StepResult:
    """Reduce the logged losses, clip, and step the optimizer unless something is not finite."""
    collective = _collectives(context.collector)
    # One all-reduce for the logged losses and the router probabilities (both float64 sums over the same ranks):
    # each collective is a rendezvous of every rank, a latency paid per call whatever its few bytes.
    with collective("all_reduce losses and router probabilities"):
        if acc.prob_sums is None:
            logged = _all_reduce_sum(acc.logged, context.stats_group)
        else:
            summed = _all_reduce_sum(torch.cat([acc.logged, acc.prob_sums.reshape(-1)]), context.stats_group)
            logged, prob_sum_LE = summed[:2], summed[2:].view_as(acc.prob_sums)
    aux = logged.new_zeros(())
    if acc.counts is not None and acc.prob_sums is not None:
        aux = _exact_balance_loss(acc.counts, prob_sum_LE, context.global_batch.routed_tokens)
    with collective("all_reduce gradient norm"):
        grad_norm = clip_grad_norm(list(model.parameters()), context.settings.max_grad_norm)
    # The step's one read from the device: every logged scalar at once, and whether they are all finite
    # (decided on the device), which says whether the optimizer steps.
    scalars = torch.stack([logged[0], logged[1], aux.to(logged), grad_norm.to(logged)])
    finite = scalars.isfinite().all().to(scalars).unsqueeze(0)
    ce_value, z_value, aux_value, norm_value, all_finite = torch.cat([scalars, finite]).tolist()
    skipped = not all_finite
    if not skipped:
        optimizer.step()
        if acc.counts is not None:
            moe_layers = [block for layer in model.layers if isinstance(block := getattr(layer, "moe", None), MoEBlock)]
            _update_router_biases(moe_layers, acc.counts)
    optimizer.zero_grad(set_to_none=True)
    return StepResult(loss=ce_value, aux_loss=aux_value, z_loss=z_value, grad_norm=norm_value, skipped=skipped)


def clip_grad_norm(parameters: list[nn.Parameter], max_norm: float) -> Tensor:
    """The global L2 norm of the gradients over all (sharded) parameters, as a device tensor (no host read);
    scales them to ``max_norm`` when above it (``max_norm`` 0: measure only). Every rank gets the same norm.

    The scaling is decided on the device (``clip_grads_with_norm_`` multiplies by min(1, max_norm / norm)): when
    the norm is not finite the gradients become non-finite too, and the step that follows is skipped and drops
    them, so nothing has to be read to choose."""
    # One group per device mesh: under expert parallelism the experts and the rest are sharded on different
    # meshes, which one DTensor op cannot mix. Each group's norm is summed over the ranks holding its shards only:
    # a replicated mesh dimension (HSDP's replicas) holds copies, so each parameter is counted once.
    by_mesh: dict[object, list[nn.Parameter]] = {}
    for param in parameters:
        if param.grad is not None:
            by_mesh.setdefault(param.grad.device_mesh if isinstance(param.grad, DTensor) else None, []).append(param)
    if not by_mesh:
        return torch.zeros(())
    norms = []
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group if p.grad is not None], norm_type=2.0, foreach=True)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = norms[0] if len(norms) == 1 else torch.stack(norms).square().sum().sqrt()
    if max_norm > 0:
        for group in by_mesh.values():
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total, foreach=True)
    return total


def _spans(collector: Collector | None) -> Callable[[str, Category], AbstractContextManager[object]]:
    if collector is None:
        return lambda name, category: contextlib.nullcontext()
    return collector.span


def _collectives(collector: Collector | None) -> Callable[[str], AbstractContextManager[object]]:
    """The trainer's own collectives (FSDP's run inside FSDP and show in the profiler's trace): a deeptrace
    COMM span each, matched across ranks by their order, and the heartbeat's last collective."""
    if collector is None:
        return lambda name: contextlib.nullcontext()
    return collector.collective


def _prob_sums(stats: Sequence[RouterStats]) -> Tensor:
    return torch.stack([s.router_prob_sum.detach() for s in stats]).to(torch.float64)


def _exact_balance_loss(counts_LE: Tensor, prob_sum_LE: Tensor, num_tokens: int) -> Tensor:
    """The load-balancing loss of the whole global batch (same formula as aux_loss.load_balancing_loss)."""
    num_experts = counts_LE.shape[1]
    per_layer_L = num_experts * (counts_LE * prob_sum_LE).sum(dim=-1) / max(num_tokens, 1) ** 2
    return per_layer_L.mean()


def _update_router_biases(moe_layers: Sequence[MoEBlock], counts_LE: Tensor) -> None:
    """Auxiliary-loss-free balancing (sigmoid routers): every rank applies the same update from the global counts."""
    for block, counts_E in zip(moe_layers, counts_LE, strict=True):
        bias = block.router.e_score_correction_bias
        if bias is not None:
            update_expert_bias(bias, counts_E, block.config.bias_update_rate)


def _all_reduce_sum(tensor: Tensor, group: dist.ProcessGroup | None = None) -> Tensor:
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor
