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
from xtrain.model.moe.experts import RoutedExperts, local_part
from xtrain.model.moe.grouped_mm import grouped_mm
from xtrain.model.moe.permute import group_offsets


def clamped_swiglu(gate_up_S2F: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """GPT-OSS's activation: (clamp(up, ±limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit)."""
    f = gate_up_S2F.shape[-1] // 2
    gate = gate_up_S2F[:, :f].clamp(max=limit)
    up = gate_up_S2F[:, f:].clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


class BiasedExperts(RoutedExperts):
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

    def compute(self, x_SD: torch.Tensor, weight_S1: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
        """Rows sorted by expert [S, D], their routing weights [S, 1], rows per expert [E] -> out_SD [S, D]."""
        impl = self.impl_for(x_SD)
        offsets_E = group_offsets(counts_E)
        # The expert of each row, on the device: output_size is known, so no host synchronisation.
        expert_S = torch.repeat_interleave(
            torch.arange(counts_E.shape[0], device=counts_E.device), counts_E, output_size=x_SD.shape[0]
        )
        gate_up_S2F = grouped_mm(x_SD, local_part(self.gate_up_proj).transpose(-2, -1), offsets_E, impl)
        h_SF = self._activation(gate_up_S2F + local_part(self.gate_up_proj_bias)[expert_S])
        out_SD = grouped_mm(h_SF, local_part(self.down_proj).transpose(-2, -1), offsets_E, impl)
        return (out_SD + local_part(self.down_proj_bias)[expert_S]) * weight_S1
