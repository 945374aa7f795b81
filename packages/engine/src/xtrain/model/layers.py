"""Building blocks of the decoder: RMSNorm, rotary position embeddings, the SwiGLU MLP.

Shape legend: T tokens of the packed row, D hidden size, H heads, K key/value heads, d head dimension,
F feed-forward (intermediate) size.

Each block computes exactly what Hugging Face's Qwen3 code computes (same order of operations, same fp32
upcasts), because the parity tests compare against it at 1e-4.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension, computed in fp32, then scaled by a learned weight."""

    def __init__(self, dim: int, eps: float, *, weight_before_cast: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.weight_before_cast = weight_before_cast
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        input_dtype = x.dtype
        x32 = x.to(torch.float32)
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight_before_cast:
            # GPT-OSS multiplies in fp32 and casts the product (matters in bf16 only).
            return (self.weight * normed).to(input_dtype)
        # The weight multiplies after the cast back, as in Qwen3 and DeepSeek-V3 (matters in bf16).
        return self.weight * normed.to(input_dtype)

    def init_weights(self) -> None:
        nn.init.ones_(self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def rotary_cos_sin(position_ids_T: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin tables [T, d] for the given positions (the "rotate half" layout of Llama/Qwen).

    Computed from the positions on every call instead of cached in a buffer: the table is tiny next to the
    attention itself, and a model built on the meta device then has no buffer that needs re-initialising.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=position_ids_T.device) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    freqs_Td2 = position_ids_T.to(torch.float32)[:, None] * inv_freq[None, :]
    angles_Td = torch.cat((freqs_Td2, freqs_Td2), dim=-1)
    return angles_Td.cos().to(dtype), angles_Td.sin().to(dtype)


def _rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary(x_THd: Tensor, cos_Td: Tensor, sin_Td: Tensor) -> Tensor:
    """Rotate queries or keys [T, H, d] by their positions' angles."""
    cos = cos_Td[:, None, :]
    sin = sin_Td[:, None, :]
    return x_THd * cos + _rotate_half(x_THd) * sin


class SwiGLUMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), without biases: the dense feed-forward of Qwen3 layers."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x_TD: Tensor) -> Tensor:
        out_TD: Tensor = self.down_proj(F.silu(self.gate_proj(x_TD)) * self.up_proj(x_TD))
        return out_TD

    def init_weights(self, std: float, generator: torch.Generator | None = None) -> None:
        for linear in (self.gate_proj, self.up_proj, self.down_proj):
            nn.init.normal_(linear.weight, mean=0.0, std=std, generator=generator)
