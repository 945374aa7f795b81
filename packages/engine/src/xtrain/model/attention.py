"""Grouped-query self-attention: Qwen3's (per-head RMSNorm on queries and keys) and GPT-OSS's (attention sinks,
sliding windows on some layers, biases).

Shape legend: T tokens of the packed row, D hidden size, H query heads, K key/value heads, d head dimension.

Order of operations as in Qwen3 / GPT-OSS: project, RMSNorm each head of q and k over d (Qwen3), rotate by
position, then causal attention inside each document: the kernel of :mod:`xtrain.model.attention_backends`, or,
with sinks or a window, the masked-softmax path of :mod:`xtrain.model.document_masked`.
"""

import torch
from torch import Tensor, nn

from xtrain.model.attention_backends import AttentionFunction
from xtrain.model.document_masked import masked_attention_per_document
from xtrain.model.documents import PackedDocuments
from xtrain.model.layers import RMSNorm, apply_rotary


class Attention(nn.Module):
    def __init__(
        self,
        *,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        rms_norm_eps: float,
        bias: bool,
        qk_norm: bool = True,
        sinks: bool = False,
        window: int | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.window = window
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=bias)
        self.q_norm = RMSNorm(head_dim, rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, rms_norm_eps) if qk_norm else None
        self.sinks = nn.Parameter(torch.empty(num_heads)) if sinks else None

    def forward(
        self,
        x_TD: Tensor,
        rotary_cos_sin: tuple[Tensor, Tensor],
        docs: PackedDocuments,
        attend: AttentionFunction,
    ) -> Tensor:
        num_tokens = x_TD.shape[0]
        q_THd = self.q_proj(x_TD).view(num_tokens, self.num_heads, self.head_dim)
        k_TKd = self.k_proj(x_TD).view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q_THd, k_TKd = self.q_norm(q_THd), self.k_norm(k_TKd)
        v_TKd = self.v_proj(x_TD).view(num_tokens, self.num_kv_heads, self.head_dim)
        cos_Td, sin_Td = rotary_cos_sin
        q_THd = apply_rotary(q_THd, cos_Td, sin_Td)
        k_TKd = apply_rotary(k_TKd, cos_Td, sin_Td)
        if self.sinks is not None or self.window is not None:
            out_THd = masked_attention_per_document(q_THd, k_TKd, v_TKd, docs, self.scale, self.window, self.sinks)
        else:
            out_THd = attend(q_THd, k_TKd, v_TKd, docs, self.scale)
        out_TD: Tensor = self.o_proj(out_THd.reshape(num_tokens, self.num_heads * self.head_dim))
        return out_TD

    def init_weights(self, std: float, generator: torch.Generator | None = None) -> None:
        for linear in (self.q_proj, self.k_proj, self.v_proj, self.o_proj):
            nn.init.normal_(linear.weight, mean=0.0, std=std, generator=generator)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)
        for norm in (self.q_norm, self.k_norm):
            if norm is not None:
                norm.init_weights()
        if self.sinks is not None:
            # transformers initialises sinks like the weights (normal, initializer_range).
            nn.init.normal_(self.sinks, mean=0.0, std=std, generator=generator)
