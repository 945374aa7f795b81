"""Multi-head latent attention (MLA) of DeepSeek-V2/V3 and Kimi K2.

Shape legend: T tokens of the packed row, D hidden size, H heads, Q query LoRA rank, C key-value LoRA rank,
n the nope part and r the rope part of a query-key head (n + r = d), v value head dimension.

Order of operations as transformers' ``DeepseekV3Attention``: queries from ``q_proj`` or from the LoRA
``q_b_proj(q_a_layernorm(q_a_proj(x)))``; keys and values from one compressed projection ``kv_a_proj_with_mqa``
[C + r] whose first C columns are normed (``kv_a_layernorm``) and expanded per head by ``kv_b_proj`` [H (n + v)],
and whose last r columns are one rotary key shared by every head. Only the rope parts are rotated; the query
and key of each head are ``cat(nope, rope)``. Values have their own width v, which SDPA accepts as is (the varlen
kernels get it padded, see ``attention_backends``). The softmax scale is ``d^-0.5``, times YaRN's
``mscale(factor, mscale_all_dim)^2``. The two LoRA norms use eps 1e-6 whatever ``rms_norm_eps`` says, as
transformers builds them.
"""

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn

from xtrain.model.attention_backends import AttentionFunction
from xtrain.model.documents import PackedDocuments
from xtrain.model.layers import RMSNorm, apply_rotary
from xtrain.model.rope import deinterleave

LORA_NORM_EPS = 1e-6
"""transformers builds q_a_layernorm and kv_a_layernorm with its RMSNorm default, not config.rms_norm_eps."""


class MLAConfig(BaseModel):
    """Shapes of multi-head latent attention (DeepSeek-V3 config.json names)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    q_lora_rank: int | None = Field(default=None, gt=0)
    """Rank Q of the query LoRA; None projects queries directly (DeepSeek-V2-Lite style)."""
    kv_lora_rank: int = Field(gt=0)
    """Rank C of the compressed key-value latent."""
    qk_nope_head_dim: int = Field(gt=0)
    """Part n of a query-key head without rotary position."""
    qk_rope_head_dim: int = Field(gt=0)
    """Part r of a query-key head that is rotated (even)."""
    v_head_dim: int = Field(gt=0)
    """Width v of a value head (may differ from n + r)."""
    rope_interleave: bool = True
    """The rope part is stored as interleaved pairs (DeepSeek's layout), de-interleaved before rotating."""

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class MLAttention(nn.Module):
    def __init__(self, *, hidden_size: int, num_heads: int, mla: MLAConfig, bias: bool, softmax_scale: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.mla = mla
        self.scale = softmax_scale
        d = mla.qk_head_dim
        self.q_proj: nn.Linear | None = None
        self.q_a_proj: nn.Linear | None = None
        self.q_a_layernorm: RMSNorm | None = None
        self.q_b_proj: nn.Linear | None = None
        if mla.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden_size, num_heads * d, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden_size, mla.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, LORA_NORM_EPS)
            self.q_b_proj = nn.Linear(mla.q_lora_rank, num_heads * d, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden_size, mla.kv_lora_rank + mla.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, LORA_NORM_EPS)
        self.kv_b_proj = nn.Linear(mla.kv_lora_rank, num_heads * (mla.qk_nope_head_dim + mla.v_head_dim), bias=False)
        self.o_proj = nn.Linear(num_heads * mla.v_head_dim, hidden_size, bias=bias)

    def _queries(self, x_TD: Tensor) -> Tensor:
        if self.q_proj is not None:
            q: Tensor = self.q_proj(x_TD)
            return q
        assert self.q_a_proj is not None and self.q_a_layernorm is not None and self.q_b_proj is not None
        q_lora: Tensor = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x_TD)))
        return q_lora

    def _rotate(self, x: Tensor, cos_Tr: Tensor, sin_Tr: Tensor) -> Tensor:
        return apply_rotary(deinterleave(x) if self.mla.rope_interleave else x, cos_Tr, sin_Tr)

    def forward(
        self,
        x_TD: Tensor,
        rotary_cos_sin: tuple[Tensor, Tensor],
        docs: PackedDocuments,
        attend: AttentionFunction,
    ) -> Tensor:
        num_tokens, heads, mla = x_TD.shape[0], self.num_heads, self.mla
        n, r, v = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
        q_THd = self._queries(x_TD).view(num_tokens, heads, n + r)
        q_nope_THn, q_rope_THr = torch.split(q_THd, [n, r], dim=-1)
        kv_nope_TC, k_rope_Tr = torch.split(self.kv_a_proj_with_mqa(x_TD), [mla.kv_lora_rank, r], dim=-1)
        kv_THnv = self.kv_b_proj(self.kv_a_layernorm(kv_nope_TC)).view(num_tokens, heads, n + v)
        k_nope_THn, v_THv = torch.split(kv_THnv, [n, v], dim=-1)
        cos_Tr, sin_Tr = rotary_cos_sin
        q_rope_THr = self._rotate(q_rope_THr, cos_Tr, sin_Tr)
        k_rope_T1r = self._rotate(k_rope_Tr.unsqueeze(1), cos_Tr, sin_Tr)
        q_THd = torch.cat((q_nope_THn, q_rope_THr), dim=-1)
        k_THd = torch.cat((k_nope_THn, k_rope_T1r.expand(num_tokens, heads, r)), dim=-1)
        out_THv = attend(q_THd, k_THd, v_THv.contiguous(), docs, self.scale)
        out_TD: Tensor = self.o_proj(out_THv.reshape(num_tokens, heads * v))
        return out_TD

    def init_weights(self, std: float, generator: torch.Generator | None = None) -> None:
        for module in self.children():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=std, generator=generator)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, RMSNorm):
                module.init_weights()
