"""Routers: which k experts each token goes to, with what weight, and the statistics the losses need.

Legend: T tokens, D hidden size, E experts, K experts per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from xtrain.model.moe.config import MoEConfig


@dataclass(frozen=True)
class Routing:
    """One forward's routing decision and the per-block loss statistics."""

    weights: torch.Tensor
    """Routing weights of the selected experts (with grad), in the dtype of the block input."""
    experts: torch.Tensor
    """Selected expert ids (int64)."""
    router_prob_sum: torch.Tensor
    """Sum over tokens of each expert's routing probability, fp32, with grad (load-balancing loss)."""
    z_loss_sum: torch.Tensor
    """Sum over tokens of logsumexp(router logits)^2, fp32 scalar, with grad."""


class Router(nn.Module):
    """Linear router over the experts: `softmax_topk` (Qwen3-MoE) or `sigmoid_group_limited` (DeepSeek-V3).

    The sigmoid router owns the buffer `e_score_correction_bias` [E] (fp32): it is added to the scores used to
    *select* experts only; the weights of the selected experts come from the unbiased scores.
    """

    def __init__(self, hidden_size: int, config: MoEConfig) -> None:
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.num_experts, hidden_size))
        self.bias = nn.Parameter(torch.empty(config.num_experts)) if config.router_bias else None
        if config.router == "sigmoid_group_limited":
            self.register_buffer("e_score_correction_bias", torch.zeros(config.num_experts, dtype=torch.float32))
        else:
            self.e_score_correction_bias: torch.Tensor | None = None

    def _apply(self, fn: Any, recurse: bool = True) -> Router:
        # `module.to(torch.bfloat16)` would round the correction bias, whose updates (about 1e-3) are below
        # bf16's resolution near 1: like transformers, keep it in fp32 whatever the model dtype.
        kept = self.e_score_correction_bias
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]  # nn.Module._apply is untyped
        moved = self.e_score_correction_bias
        if kept is None or moved is None or moved.dtype == torch.float32:
            return self
        if kept.is_meta or moved.is_meta:
            # No values to keep (a model built on the meta device, or moved there): keep the dtype, so that
            # meta -> .to(bf16) -> to_empty still allocates the bias in fp32.
            self.e_score_correction_bias = torch.empty_like(moved, dtype=torch.float32)
        else:
            self.e_score_correction_bias = kept.to(device=moved.device)  # exact values, not rounded through bf16
        return self

    def forward(self, x: torch.Tensor) -> Routing:
        """Route x [T, D]."""
        if self.config.router == "softmax_topk":
            return self._softmax_topk(x)
        if self.config.router == "topk_softmax":
            return self._topk_softmax(x)
        return self._sigmoid_group_limited(x)

    def _topk_softmax(self, x: torch.Tensor) -> Routing:
        # GPT-OSS: logits (with bias) in the input dtype, top-k of the logits, softmax over the k selected
        # in that same dtype, as transformers' GptOssTopKRouter computes it.
        logits_TE = F.linear(x, self.weight, self.bias)
        top_TK, experts_TK = torch.topk(logits_TE, self.config.num_experts_per_tok, dim=-1)
        weights_TK = torch.softmax(top_TK, dim=-1)
        logits32_TE = logits_TE.float()
        return Routing(
            weights=weights_TK * self.config.routed_scaling_factor,
            experts=experts_TK,
            # The balance statistic is the full softmax, as in transformers' load_balancing_loss_func.
            router_prob_sum=torch.softmax(logits32_TE, dim=-1).sum(dim=0),
            z_loss_sum=torch.logsumexp(logits32_TE, dim=-1).square().sum(),
        )

    def _softmax_topk(self, x: torch.Tensor) -> Routing:
        k = self.config.num_experts_per_tok
        # Logits in the input dtype and softmax in fp32, as Qwen3-MoE computes them.
        logits_TE = F.linear(x, self.weight).float()
        probs_TE = torch.softmax(logits_TE, dim=-1)
        weights_TK, experts_TK = torch.topk(probs_TE, k, dim=-1)
        if self.config.norm_topk_prob:
            weights_TK = weights_TK / weights_TK.sum(dim=-1, keepdim=True)
        weights_TK = weights_TK * self.config.routed_scaling_factor
        return Routing(
            weights=weights_TK.to(x.dtype),
            experts=experts_TK,
            router_prob_sum=probs_TE.sum(dim=0),
            z_loss_sum=torch.logsumexp(logits_TE, dim=-1).square().sum(),
        )

    def _sigmoid_group_limited(self, x: torch.Tensor) -> Routing:
        cfg = self.config
        bias_E = self.e_score_correction_bias
        assert bias_E is not None
        # DeepSeek-V3 keeps the router in fp32 whatever the model dtype.
        logits_TE = F.linear(x.float(), self.weight.float())
        scores_TE = logits_TE.sigmoid()
        with torch.no_grad():
            choice_TE = scores_TE + bias_E
            if cfg.n_group > 1:
                grouped_TGe = choice_TE.view(choice_TE.shape[0], cfg.n_group, -1)
                group_score_TG = grouped_TGe.topk(2, dim=-1).values.sum(dim=-1)
                top_groups_TG = torch.topk(group_score_TG, cfg.topk_group, dim=-1).indices
                keep_TG = torch.zeros_like(group_score_TG, dtype=torch.bool).scatter_(1, top_groups_TG, True)
                keep_TE = keep_TG.repeat_interleave(cfg.num_experts // cfg.n_group, dim=1)
                choice_TE = choice_TE.masked_fill(~keep_TE, float("-inf"))
            experts_TK = torch.topk(choice_TE, cfg.num_experts_per_tok, dim=-1).indices
        weights_TK = scores_TE.gather(1, experts_TK)
        if cfg.norm_topk_prob:
            weights_TK = weights_TK / (weights_TK.sum(dim=-1, keepdim=True) + 1e-20)
        weights_TK = weights_TK * cfg.routed_scaling_factor
        # The balance statistic uses per-token normalised scores, so that they sum to one like probabilities.
        probs_TE = scores_TE / (scores_TE.sum(dim=-1, keepdim=True) + 1e-20)
        return Routing(
            weights=weights_TK.to(x.dtype),
            experts=experts_TK,
            router_prob_sum=probs_TE.sum(dim=0),
            z_loss_sum=torch.logsumexp(logits_TE, dim=-1).square().sum(),
        )


@torch.no_grad()
def update_expert_bias(bias: torch.Tensor, tokens_per_expert: torch.Tensor, rate: float) -> None:
    """Aux-loss-free balancing step (DeepSeek-V3): `bias += rate * sign(mean_load - load)`, in place.

    Pass the tokens per expert counted over the whole global batch (summed over micro-batches and ranks, see
    docs/engine-moe.md), so every rank applies the same update; call it once per optimizer step.
    """
    load_E = tokens_per_expert.to(device=bias.device, dtype=torch.float32)
    bias.add_(torch.sign(load_E.mean() - load_E).to(bias.dtype), alpha=rate)
