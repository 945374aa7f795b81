"""The MoE block: router, dropless routed experts, optional shared experts, and the statistics for its losses.

Legend: T tokens, D hidden size, E experts, K experts per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from xtrain.model.layers import SwiGLUMLP
from xtrain.model.moe.biased_experts import BiasedExperts
from xtrain.model.moe.config import MoEConfig
from xtrain.model.moe.experts import GroupedExperts
from xtrain.model.moe.router import Router


@dataclass(frozen=True)
class RouterStats:
    """What the auxiliary losses need from one MoE block's forward (see `xtrain.model.moe.aux_loss`)."""

    tokens_per_expert: torch.Tensor
    """[E] int64, detached: token-expert assignments per expert (sums to num_tokens * K)."""
    router_prob_sum: torch.Tensor
    """[E] fp32 with grad: sum over tokens of each expert's routing probability."""
    num_tokens: int
    """Tokens T this forward routed."""
    z_loss_sum: torch.Tensor
    """fp32 scalar with grad: sum over tokens of logsumexp(router logits)^2."""


class MoEBlock(nn.Module):
    """Mixture-of-Experts feed-forward block over a flat token batch x [T, D].

    Submodules: `router` (weight [E, D]; buffer `e_score_correction_bias` [E] for the sigmoid router; `bias` [E]
    for GPT-OSS's), `experts` (`gate_up_proj` [E, 2F, D], `down_proj` [E, D, F]; with `expert_bias` also
    `gate_up_proj_bias` [E, 2F] and `down_proj_bias` [E, D]), `shared_experts` (SwiGLU, optional).
    """

    def __init__(self, hidden_size: int, config: MoEConfig) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.config = config
        self.router = Router(hidden_size, config)
        biased = config.expert_bias or config.expert_activation != "swiglu"
        self.experts: GroupedExperts | BiasedExperts = (
            BiasedExperts(hidden_size, config) if biased else GroupedExperts(hidden_size, config)
        )
        self.shared_experts = (
            # The shared experts are fused into one dense SwiGLU MLP, as DeepSeek-V3 stores them.
            SwiGLUMLP(hidden_size, config.shared_intermediate_size) if config.num_shared_experts > 0 else None
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, RouterStats]:
        """x [T, D] -> (y [T, D], RouterStats)."""
        if x.dim() != 2 or x.shape[1] != self.hidden_size:
            raise ValueError(
                f"MoEBlock expects x of shape [T, {self.hidden_size}], got {tuple(x.shape)}: flatten batch and "
                "sequence dimensions first"
            )
        routing = self.router(x)
        with torch.no_grad():
            # scatter_add rather than bincount: no device-to-host sync on accelerators.
            tokens_per_expert_E = torch.zeros(self.config.num_experts, dtype=torch.int64, device=x.device).scatter_add_(
                0, routing.experts.reshape(-1), torch.ones_like(routing.experts.reshape(-1))
            )
        y_TD = self.experts(x, routing.weights, routing.experts, tokens_per_expert_E)
        if self.shared_experts is not None:
            y_TD = y_TD + self.shared_experts(x)
        stats = RouterStats(
            tokens_per_expert=tokens_per_expert_E,
            router_prob_sum=routing.router_prob_sum,
            num_tokens=x.shape[0],
            z_loss_sum=routing.z_loss_sum,
        )
        return y_TD, stats

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Deterministic initialisation (e.g. after `to_empty` from the meta device): normal(0, init_std) for
        every weight, zero correction bias. Seed with `generator` or the global torch seed."""
        std = self.config.init_std
        weights = [self.router.weight, self.experts.gate_up_proj, self.experts.down_proj]
        if self.shared_experts is not None:
            weights += list(self.shared_experts.parameters())
        for w in weights:
            nn.init.normal_(w, mean=0.0, std=std, generator=generator)
        if isinstance(self.experts, BiasedExperts):
            nn.init.zeros_(self.experts.gate_up_proj_bias)
            nn.init.zeros_(self.experts.down_proj_bias)
        if self.router.bias is not None:
            nn.init.zeros_(self.router.bias)
        if self.router.e_score_correction_bias is not None:
            self.router.e_score_correction_bias.zero_()
