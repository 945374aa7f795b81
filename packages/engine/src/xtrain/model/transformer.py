"""The decoder-only transformer (Qwen3 and Qwen3-MoE), on one packed row of documents.

Shape legend: T tokens of the packed row, D hidden size, V vocabulary size.

The model knows nothing of parallelism: FSDP, activation checkpointing and compile are applied from outside,
per decoder layer (``model.layers``). Build it on the meta device and materialise it afterwards::

    with torch.device("meta"):
        model = Transformer(config)
    model.to_empty(device="cuda")
    model.init_weights()

For a chunked loss, call :meth:`Transformer.forward_hidden` and project chunks of the hidden states with
:attr:`Transformer.output_projection_weight` instead of materialising [T, V] logits.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from xtrain.model.attention import Attention
from xtrain.model.attention_backends import (
    AttentionFunction,
    attention_function,
    detect_capabilities,
    select_attention_backend,
)
from xtrain.model.config import ModelConfig
from xtrain.model.documents import PackedDocuments
from xtrain.model.layers import RMSNorm, SwiGLUMLP, rotary_cos_sin
from xtrain.model.moe import MoEBlock, RouterStats


@dataclass
class ModelOutput:
    hidden: Tensor
    """[1, T, D] hidden states after the final norm."""
    router_stats: list[RouterStats]
    """One entry per MoE layer, in layer order (empty for a dense model)."""


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attention(norm(x)), then x + feed_forward(norm(x)); the feed-forward is a dense
    SwiGLU MLP (``mlp``) or a mixture of experts (``moe``), exactly one of the two."""

    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.attention_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = Attention(
            hidden_size=config.hidden_size,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            rms_norm_eps=config.rms_norm_eps,
            bias=config.attention_bias,
        )
        self.ffn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: SwiGLUMLP | None = None
        self.moe: MoEBlock | None = None
        if config.is_moe_layer(layer_index):
            assert config.moe is not None  # is_moe_layer implies it
            self.moe = MoEBlock(config.hidden_size, config.moe)
        else:
            self.mlp = SwiGLUMLP(config.hidden_size, config.intermediate_size)

    def forward(
        self,
        x_TD: Tensor,
        rotary: tuple[Tensor, Tensor],
        docs: PackedDocuments,
        attend: AttentionFunction,
    ) -> tuple[Tensor, RouterStats | None]:
        x_TD = x_TD + self.attention(self.attention_norm(x_TD), rotary, docs, attend)
        h_TD = self.ffn_norm(x_TD)
        if self.moe is not None:
            ffn_TD, stats = self.moe(h_TD)
            return x_TD + ffn_TD, stats
        assert self.mlp is not None
        return x_TD + self.mlp(h_TD), None

    def init_weights(self, std: float, generator: torch.Generator | None) -> None:
        self.attention_norm.init_weights()
        self.attention.init_weights(std, generator)
        self.ffn_norm.init_weights()
        if self.mlp is not None:
            self.mlp.init_weights(std, generator)
        if self.moe is not None:
            # The block initialises from its own config.init_std (set from initializer_range on HF import).
            self.moe.init_weights(generator)


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(config, i) for i in range(config.num_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # Tied: the output projection is the embedding matrix itself, so there is no lm_head module at all.
        self.lm_head = (
            None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )

    @property
    def output_projection_weight(self) -> Tensor:
        """[V, D]: logits = hidden @ weight.T (the lm_head, or the embedding when tied)."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @property
    def attention_backend(self) -> str:
        """The attention kernel the model uses where its parameters are now (raises if the configured one
        cannot run there)."""
        weight = self.embed_tokens.weight
        return _resolve_backend(self.config.attention_backend, weight.device, weight.dtype)

    def forward_hidden(
        self, input_ids_1T: Tensor, cu_seqlens: Tensor | None = None, *, documents: PackedDocuments | None = None
    ) -> ModelOutput:
        """Hidden states [1, T, D] after the final norm, and the router statistics of every MoE layer.

        The documents of the row are given by ``cu_seqlens`` (int32 [N+1]; None: one document), or by an already
        built ``documents`` (no device-to-host sync for reading the lengths).
        """
        if input_ids_1T.dim() != 2 or input_ids_1T.shape[0] != 1:
            raise ValueError(
                f"input_ids must be one packed row of shape [1, T], got {tuple(input_ids_1T.shape)}; "
                "pack several documents into the row and pass their boundaries as cu_seqlens"
            )
        ids_T = input_ids_1T[0]
        if documents is not None:
            if cu_seqlens is not None or documents.num_tokens != ids_T.shape[0]:
                raise ValueError(
                    f"pass either cu_seqlens or documents, and documents must cover the row's {ids_T.shape[0]} "
                    f"tokens (it covers {documents.num_tokens})"
                )
            docs = documents
        else:
            docs = PackedDocuments.from_cu_seqlens(cu_seqlens, ids_T.shape[0], ids_T.device)
        x_TD = self.embed_tokens(ids_T)
        attend = attention_function(_resolve_backend(self.config.attention_backend, x_TD.device, x_TD.dtype))
        rotary = rotary_cos_sin(docs.position_ids, self.config.head_dim, self.config.rope_theta, x_TD.dtype)
        router_stats: list[RouterStats] = []
        for layer in self.layers:
            x_TD, stats = layer(x_TD, rotary, docs, attend)
            if stats is not None:
                router_stats.append(stats)
        return ModelOutput(hidden=self.norm(x_TD).unsqueeze(0), router_stats=router_stats)

    def forward(
        self, input_ids_1T: Tensor, cu_seqlens: Tensor | None = None, *, documents: PackedDocuments | None = None
    ) -> Tensor:
        """Logits [1, T, V] of the packed row (materialises them all: use forward_hidden for long rows)."""
        hidden_1TD = self.forward_hidden(input_ids_1T, cu_seqlens, documents=documents).hidden
        return F.linear(hidden_1TD, self.output_projection_weight)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Initialise every parameter in place (normal(0, initializer_range) for matrices, ones for norms).

        Deterministic given the generator (or the global RNG state); works after ``to_empty`` from the meta
        device because it writes every parameter and the model holds no buffers.
        """
        std = self.config.initializer_range
        nn.init.normal_(self.embed_tokens.weight, mean=0.0, std=std, generator=generator)
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)
            layer.init_weights(std, generator)
        self.norm.init_weights()
        if self.lm_head is not None:
            nn.init.normal_(self.lm_head.weight, mean=0.0, std=std, generator=generator)


def _resolve_backend(requested: str, device: torch.device, dtype: torch.dtype) -> str:
    return select_attention_backend(requested, detect_capabilities(device, dtype))
