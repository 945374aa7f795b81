"""Dropless routed experts: one permutation of the token-expert slots by expert, two grouped matmuls, one combine.

Legend: T tokens, D hidden size, E experts, K experts per token, F expert hidden size,
S = T*K token-expert slots (sorted by expert inside this module).
"""

from __future__ import annotations

import torch
from torch import nn

from xtrain.model.moe.config import MoEConfig
from xtrain.model.moe.cpu_experts import FusedExpertsCPU
from xtrain.model.moe.grouped_mm import GroupedImpl, grouped_mm, resolve_impl
from xtrain.model.moe.permute import CombineRows, DispatchRows, WeightedSwiGLU, group_layout, sort_slots


class GroupedExperts(nn.Module):
    """E SwiGLU experts stored as stacked tensors, computed dropless with grouped matmuls.

    Parameters (the layout transformers 5.x keeps in memory for Qwen3-MoE / DeepSeek-V3):
    `gate_up_proj` [E, 2F, D] (rows 0..F-1 the gate projection, F..2F-1 the up projection) and
    `down_proj` [E, D, F].
    """

    def __init__(self, hidden_size: int, config: MoEConfig) -> None:
        super().__init__()
        self.config = config
        e, f = config.num_experts, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * f, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(e, hidden_size, f))

    def impl_for(self, x: torch.Tensor) -> GroupedImpl:
        """The grouped-matmul implementation used for this input (device, dtype, shapes)."""
        requested = "auto" if self.config.experts_impl == "cpu_fused" else self.config.experts_impl
        first = resolve_impl(requested, x, self.gate_up_proj.transpose(-2, -1))
        second = resolve_impl(requested, x, self.down_proj.transpose(-2, -1))
        return "grouped_mm" if first == second == "grouped_mm" else "loop"

    def fused_cpu(self, x: torch.Tensor, impl: GroupedImpl) -> bool:
        """Whether the experts run as `FusedExpertsCPU`: only when asked for (`experts_impl="cpu_fused"`), on the
        CPU in eager mode where grouped_mm would run. The default fast path stays torch's grouped matmul, with no
        Python loop over experts (accelerators, torch.compile, and CPU unless asked)."""
        return (
            self.config.experts_impl == "cpu_fused"
            and impl == "grouped_mm"
            and x.device.type == "cpu"
            and not torch.compiler.is_compiling()
        )

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
        impl = self.impl_for(x)
        order_S, token_S = sort_slots(routed_experts)
        # The routing weight scales the F-wide activation rather than the D-wide output: the same product
        # (the down projection is linear), a quarter of the elementwise work at F = D/4.
        weight_S1 = routing_weights.reshape(-1)[order_S].unsqueeze(-1)
        if self.fused_cpu(x, impl):
            # Opt-in: torch's CPU grouped matmul is itself a loop of one matmul per expert; the fused loop runs
            # the same matmuls without any S×D temporary (see cpu_experts.py).
            y: torch.Tensor = FusedExpertsCPU.apply(  # type: ignore[no-untyped-call]
                x, weight_S1, self.gate_up_proj, self.down_proj, token_S, tokens_per_expert.tolist()
            )
            return y
        slot_rank_S, offsets_E = group_layout(order_S, tokens_per_expert)
        x_SD: torch.Tensor = DispatchRows.apply(x, token_S, slot_rank_S, k)  # type: ignore[no-untyped-call]
        gate_up_S2F = grouped_mm(x_SD, self.gate_up_proj.transpose(-2, -1), offsets_E, impl)
        h_SF: torch.Tensor = WeightedSwiGLU.apply(gate_up_S2F, weight_S1)  # type: ignore[no-untyped-call]
        out_SD = grouped_mm(h_SF, self.down_proj.transpose(-2, -1), offsets_E, impl)
        y_TD: torch.Tensor = CombineRows.apply(out_SD, token_S, slot_rank_S, k)  # type: ignore[no-untyped-call]
        return y_TD
