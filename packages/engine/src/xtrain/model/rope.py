"""Rotary position tables with optional YaRN scaling, computed as transformers computes them.

Shape legend: T tokens of the packed row, r rotary dimension (the head dimension, or DeepSeek-V3's
``qk_rope_head_dim``).

YaRN (DeepSeek-V3, Kimi K2 and GPT-OSS checkpoints use it) blends interpolated and extrapolated inverse
frequencies over a linear ramp between two correction dimensions, and multiplies cos and sin by an
"attention factor". DeepSeek-V3 additionally multiplies the softmax scale by ``mscale(factor, mscale_all_dim)^2``
(:func:`yarn_softmax_scale`). Every formula follows ``transformers.modeling_rope_utils._compute_yarn_parameters``
(5.x) step by step, including where it computes in fp32, because the parity tests compare at 1e-4.
"""

import math

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor


class YarnScaling(BaseModel):
    """YaRN rotary scaling (config.json ``rope_parameters`` / ``rope_scaling`` with ``rope_type: yarn``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    factor: float = Field(gt=0)
    """Context extension factor: interpolated frequencies are divided by it."""
    original_max_position_embeddings: int = Field(gt=0)
    """Context length of pre-training, which places the ramp's correction dimensions."""
    beta_fast: float = 32.0
    """Rotations at which the ramp starts (extrapolation above)."""
    beta_slow: float = 1.0
    """Rotations at which the ramp ends (interpolation below)."""
    mscale: float | None = None
    """DeepSeek's numerator scale of the attention factor (with ``mscale_all_dim``)."""
    mscale_all_dim: float | None = None
    """DeepSeek's denominator scale of the attention factor, and of the softmax-scale correction."""
    attention_factor: float | None = None
    """Explicit cos/sin multiplier; None derives it from factor and mscale as transformers does."""
    truncate: bool = True
    """Round the correction dimensions to integers (GPT-OSS sets False)."""


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(scaling: YarnScaling) -> float:
    """The multiplier of cos and sin."""
    if scaling.attention_factor is not None:
        return scaling.attention_factor
    if scaling.mscale and scaling.mscale_all_dim:
        return _mscale(scaling.factor, scaling.mscale) / _mscale(scaling.factor, scaling.mscale_all_dim)
    return _mscale(scaling.factor)


def yarn_softmax_scale(scaling: YarnScaling | None) -> float:
    """DeepSeek-V3's correction of the softmax scale: ``mscale(factor, mscale_all_dim)^2`` (1 without it)."""
    if scaling is None or not scaling.mscale_all_dim:
        return 1.0
    return _mscale(scaling.factor, scaling.mscale_all_dim) ** 2


def inverse_frequencies(dim: int, theta: float, scaling: YarnScaling | None) -> tuple[Tensor, float]:
    """fp32 inverse frequencies [r/2] and the cos/sin multiplier (1.0 without scaling)."""
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    if scaling is None:
        return 1.0 / pos_freqs, 1.0

    def correction_dim(rotations: float) -> float:
        original = scaling.original_max_position_embeddings
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(scaling.beta_fast), correction_dim(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp
    inv_freq = (1.0 / (scaling.factor * pos_freqs)) * (1 - extrapolation_weight) + (
        1.0 / pos_freqs
    ) * extrapolation_weight
    return inv_freq, yarn_attention_factor(scaling)


def rotary_tables(
    position_ids_T: Tensor, dim: int, theta: float, scaling: YarnScaling | None, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """cos and sin [T, r] in the "rotate half" layout, scaled by the attention factor, cast to ``dtype``.

    Computed from the positions on every call (no cached buffer: a model built on the meta device then has
    nothing to re-initialise, and the table is tiny next to attention).
    """
    inv_freq, factor = inverse_frequencies(dim, theta, scaling)
    freqs_Tr2 = position_ids_T.to(torch.float32)[:, None] * inv_freq.to(position_ids_T.device)[None, :]
    angles_Tr = torch.cat((freqs_Tr2, freqs_Tr2), dim=-1)
    return (angles_Tr.cos() * factor).to(dtype), (angles_Tr.sin() * factor).to(dtype)


def deinterleave(x: Tensor) -> Tensor:
    """(x0, x1, x2, x3, ...) -> (x0, x2, ..., x1, x3, ...) on the last dimension.

    DeepSeek's checkpoints rotate interleaved pairs (``rope_interleave``); transformers computes that rotation
    with its output in this de-interleaved order, which equals de-interleaving first and rotating halves.
    """
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
