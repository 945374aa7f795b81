"""The MoE block: router, dropless routed experts, optional shared experts, and the statistics for its losses.

Legend: T tokens, D hidden size, E experts, K experts per token.

The forward runs in stages: ``route`` (router, tokens per expert), the routed experts (permute → local experts →
combine), the shared experts. By default the routed experts run on this device (``RoutedExperts.forward``). A
step applied from outside may set ``expert_schedule``, a callable that takes the block, its input and its routing
and returns routed plus shared output: ``xtrain.parallel.expert_parallel`` installs one that moves the sorted rows
to the ranks holding their experts and back (optionally in slices that overlap communication with compute). The
block itself knows nothing of how.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from xtrain.model.layers import SwiGLUMLP
from xtrain.model.moe.biased_experts import BiasedExperts
from xtrain.model.moe.config import MoEConfig
from xtrain.model.moe.experts import GroupedExperts
from xtrain.model.moe.router import Router, Routing


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


ExpertSchedule = Callable[["MoEBlock", torch.Tensor, Routing], torch.Tensor]
"""(block, x_TD, routing) -> routed plus shared experts' output y_TD: replaces the one-device stages."""


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
        self.experts: GroupedExperts | BiasedExperts = (
            BiasedExperts(hidden_size, config) if config.biased_experts else GroupedExperts(hidden_size, config)
        )
        self.shared_experts = (
            # The shared experts are fused into one dense SwiGLU MLP, as DeepSeek-V3 stores them.
            SwiGLUMLP(hidden_size, config.shared_intermediate_size) if config.num_shared_experts > 0 else None
        )
        # A plain attribute, not a submodule: it holds no parameters and is no part of the state dict.
        self.expert_schedule: ExpertSchedule | None = None

    def route(self, x: torch.Tensor) -> Routing:
        """The router's decision for x [T, D]."""
        routing: Routing = self.router(x)
        return routing

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, RouterStats]:
        """x [T, D] -> (y [T, D], RouterStats)."""
        if x.dim() != 2 or x.shape[1] != self.hidden_size:
            raise ValueError(
                f"MoEBlock expects x of shape [T, {self.hidden_size}], got {tuple(x.shape)}: flatten batch and "
                "sequence dimensions first"
            )
        routing = self.route(x)
        tokens_per_expert_E = count_tokens_per_expert(routing.experts, self.config.num_experts)
        if self.expert_schedule is not None:
            y_TD = self.expert_schedule(self, x, routing)
        else:
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


@torch.no_grad()
def count_tokens_per_expert(routed_experts_TK: torch.Tensor, num_experts: int) -> torch.Tensor:
    """[E] int64 token-expert assignments per expert. scatter_add rather than bincount: no device-to-host sync on
    accelerators."""
    flat = routed_experts_TK.reshape(-1)
    return torch.zeros(num_experts, dtype=torch.int64, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
