"""Auxiliary router losses over the global batch: load balancing and z-loss.

Each function takes the `RouterStats` of every MoE layer of ONE micro-batch and returns that micro-batch's
exact share of the global-batch loss when given the global counts; summing the returned values over all
micro-batches (and ranks) gives the loss of the whole batch at once. Neither function applies the config's
coefficient: the trainer multiplies by `MoEConfig.aux_loss_coef` / `z_loss_coef`.

How the trainer obtains the global counts (models know nothing of parallelism):
`global_tokens_per_expert` [L, E] is `torch.stack([s.tokens_per_expert for s in stats])` summed over every
micro-batch of the step and all-reduced (SUM) over the data-parallel ranks; `global_num_tokens` is the number of
tokens of the whole step (all micro-batches, all ranks), known from the batch before any forward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from xtrain.model.moe.block import RouterStats


def _check_layers(stats: Sequence[RouterStats]) -> None:
    if not stats:
        raise ValueError("no RouterStats given: pass the stats of every MoE layer of the forward")


def load_balancing_loss(
    stats: Sequence[RouterStats],
    global_tokens_per_expert: torch.Tensor | None = None,
    global_num_tokens: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Switch-style balance loss, averaged over layers: for each layer
    `E * sum_e (count_e / N) * (prob_sum_e / N)` with count_e the top-k assignments of expert e and N the tokens,
    the per-layer definition of transformers' `load_balancing_loss_func` (k at perfect balance).

    Without global arguments: this micro-batch alone. With them: counts and N are those of the global batch and
    only `prob_sum` (which carries the gradient) is this micro-batch's, so the shares add up to the global loss.
    """
    _check_layers(stats)
    if (global_tokens_per_expert is None) != (global_num_tokens is None):
        raise ValueError("pass both global_tokens_per_expert and global_num_tokens, or neither")
    num_experts = stats[0].router_prob_sum.shape[0]
    prob_sum_LE = torch.stack([s.router_prob_sum.float() for s in stats])
    if global_tokens_per_expert is None:
        counts_LE = torch.stack([s.tokens_per_expert for s in stats]).float()
        tokens_L = torch.tensor([float(s.num_tokens) for s in stats], device=prob_sum_LE.device)
    else:
        counts_LE = global_tokens_per_expert.to(device=prob_sum_LE.device, dtype=torch.float32)
        if counts_LE.shape != prob_sum_LE.shape:
            raise ValueError(
                f"global_tokens_per_expert has shape {tuple(counts_LE.shape)}, expected [layers, experts] = "
                f"{tuple(prob_sum_LE.shape)}: stack the per-layer counts in the order of `stats`"
            )
        assert global_num_tokens is not None
        tokens_L = torch.as_tensor(global_num_tokens, dtype=torch.float32, device=prob_sum_LE.device).expand(len(stats))
    # clamp: an empty micro-batch contributes zero rather than 0/0.
    per_layer_L = num_experts * (counts_LE.detach() * prob_sum_LE).sum(dim=-1) / tokens_L.clamp_min(1).square()
    return per_layer_L.mean()


def router_z_loss(stats: Sequence[RouterStats], global_num_tokens: int | torch.Tensor | None = None) -> torch.Tensor:
    """Mean over tokens of logsumexp(router logits)^2, averaged over layers (ST-MoE's z-loss).

    With `global_num_tokens` the sum is divided by the global token count, so micro-batch shares add up.
    """
    _check_layers(stats)
    z_L = torch.stack([s.z_loss_sum.float() for s in stats])
    if global_num_tokens is None:
        tokens_L = torch.tensor([float(s.num_tokens) for s in stats], device=z_L.device)
    else:
        tokens_L = torch.as_tensor(global_num_tokens, dtype=torch.float32, device=z_L.device).expand(len(stats))
    return (z_L / tokens_L.clamp_min(1)).mean()
