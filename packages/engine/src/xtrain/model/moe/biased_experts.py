"""GPT-OSS's routed experts: biased gate/up and down projections around a clamped SwiGLU.

Legend: T tokens, D hidden size, E experts, K experts per token, F expert hidden size, S = T*K token-expert slots
(sorted by expert inside this module).

Same permutation, dispatch, grouped matmuls and combine as :class:`~xtrain.model.moe.experts.GroupedExperts`;
what differs is the arithmetic between them, written with standard ops (autograd differentiates it):
``gate_up = x W1ᵀ + b1[e]``, the activation of :func:`clamped_swiglu`, ``out = h W2ᵀ + b2[e]``, and the routing
weight multiplies ``out`` (the down bias forbids moving it onto the activation as the unbiased experts do).
Parameters keep xtrain's expert layout (``gate_up_proj`` [E, 2F, D] with the gate rows first, ``down_proj``
[E, D, F]); the conversion from GPT-OSS's checkpoint layout ([E, D, 2F] with gate and up interleaved) is in
``hf_keys``.
"""

from __future__ import annotations

import torch
from torch import nn

from xtrain.model.moe.config import MoEConfig
from xtrain.model.moe.grouped_mm import GroupedImpl, grouped_mm, resolve_impl
from xtrain.model.moe.permute import CombineRows, DispatchRows, group_layout, sort_slots


def clamped_swiglu(gate_up_S2F: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """GPT-OSS's activation: (clamp(up, ±limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit)."""
    f = gate_up_S2F.shape[-1] // 2
    gate = gate_up_S2F[:, :f].clamp(max=limit)
    up = gate_up_S2F[:, f:].clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


class BiasedExperts(nn.Module):
    """E experts with biases; the clamped SwiGLU (GPT-OSS) or the plain one."""

    def __init__(self, hidden_size: int, config: MoEConfig) -> None:
        super().__init__()
        self.config = config
        e, f = config.num_experts, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * f, hidden_size))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(e, 2 * f))
        self.down_proj = nn.Parameter(torch.empty(e, hidden_size, f))
        self.down_proj_bias = nn.Parameter(torch.empty(e, hidden_size))

    def _activation(self, gate_up_S2F: torch.Tensor) -> torch.Tensor:
        if self.config.expert_activation == "clamped_swiglu":
            return clamped_swiglu(gate_up_S2F, self.config.swiglu_alpha, self.config.swiglu_limit)
        f = gate_up_S2F.shape[-1] // 2
        return torch.nn.functional.silu(gate_up_S2F[:, :f]) * gate_up_S2F[:, f:]

    def _impl_for(self, x: torch.Tensor) -> GroupedImpl:
        # As for the unbiased experts; "cpu_fused" has no biased variant and means "auto" here.
        requested = "auto" if self.config.experts_impl == "cpu_fused" else self.config.experts_impl
        first = resolve_impl(requested, x, self.gate_up_proj.transpose(-2, -1))
        second = resolve_impl(requested, x, self.down_proj.transpose(-2, -1))
        return "grouped_mm" if first == second == "grouped_mm" else "loop"

    # torch.autograd.Function.apply is untyped: the calls below carry a targeted ignore.
    def forward(
        self,
        x: torch.Tensor,
        routing_weights: torch.Tensor,
        routed_experts: torch.Tensor,
        tokens_per_expert: torch.Tensor,
    ) -> torch.Tensor:
        """x [T, D], routing weights and expert ids [T, K], tokens per expert [E] -> y [T, D]."""
        k = routed_experts.shape[1]
        impl = self._impl_for(x)
        order_S, token_S = sort_slots(routed_experts)
        slot_rank_S, offsets_E = group_layout(order_S, tokens_per_expert)
        expert_S = routed_experts.reshape(-1)[order_S]
        weight_S1 = routing_weights.reshape(-1)[order_S].unsqueeze(-1)
        x_SD: torch.Tensor = DispatchRows.apply(x, token_S, slot_rank_S, k)  # type: ignore[no-untyped-call]
        gate_up_S2F = grouped_mm(x_SD, self.gate_up_proj.transpose(-2, -1), offsets_E, impl)
        h_SF = self._activation(gate_up_S2F + self.gate_up_proj_bias[expert_S])
        out_SD = grouped_mm(h_SF, self.down_proj.transpose(-2, -1), offsets_E, impl)
        out_SD = (out_SD + self.down_proj_bias[expert_S]) * weight_S1
        y_TD: torch.Tensor = CombineRows.apply(out_SD, token_S, slot_rank_S, k)  # type: ignore[no-untyped-call]
        return y_TD
