"""The decoder-only transformer (Qwen3, Qwen3-MoE, DeepSeek-V3, GPT-OSS), on one packed row of documents.

Shape legend: T tokens of the packed row, D hidden size, V vocabulary size.

The model knows nothing of parallelism: FSDP, activation checkpointing and compile are applied from outside,
per decoder layer (``model.layers``). Build it on the meta device and materialise it afterwards::

    with torch.device("meta"):
        model = Transformer(config)
    model.to_empty(device="cuda")
    model.init_weights(seed=0)

For a chunked loss, call :meth:`Transformer.forward_with_head` with a head that projects chunks of the hidden
states with the output weight instead of materialising [T, V] logits.

Initialisation is defined part by part (:meth:`Transformer.init_part_names`, :meth:`Transformer.init_part`), each
part with its own generator seeded from the run's seed and the part's index, so that code outside the model can
initialise a sharded model one part at a time and obtain exactly the weights of the unsharded model.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from xtrain.model.attention import Attention
from xtrain.model.attention_backends import (
    AttentionFunction,
    detect_capabilities,
    resolve_attention,
    select_attention_backend,
)
from xtrain.model.config import ModelConfig
from xtrain.model.documents import PackedDocuments
from xtrain.model.layers import RMSNorm, SwiGLUMLP
from xtrain.model.mla import MLAttention
from xtrain.model.moe import MoEBlock, RouterStats
from xtrain.model.rope import rotary_tables

HeadOutput = TypeVar("HeadOutput")


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
        self.attention_norm = _norm(config)
        self.attention: Attention | MLAttention
        if config.mla is not None:
            self.attention = MLAttention(
                hidden_size=config.hidden_size,
                num_heads=config.num_attention_heads,
                mla=config.mla,
                bias=config.attention_bias,
                softmax_scale=config.softmax_scale,
            )
        else:
            self.attention = Attention(
                hidden_size=config.hidden_size,
                num_heads=config.num_attention_heads,
                num_kv_heads=config.num_kv_heads,
                head_dim=config.head_dim,
                rms_norm_eps=config.rms_norm_eps,
                bias=config.attention_bias,
                qk_norm=config.qk_norm,
                sinks=config.attention_sinks,
                window=config.layer_window(layer_index),
            )
        self.ffn_norm = _norm(config)
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
        self.norm = _norm(config)
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
        cannot run there); "masked_softmax" for models with attention sinks, which every layer computes on the
        path of xtrain.model.document_masked (sliding-window layers without sinks too; full layers without sinks
        use the backend named here)."""
        if self.config.attention_sinks:
            return "masked_softmax"
        weight = self.embed_tokens.weight
        return _resolve_backend(self.config.attention_backend, weight.device, weight.dtype)

    def forward_hidden(
        self, input_ids_1T: Tensor, cu_seqlens: Tensor | None = None, *, documents: PackedDocuments | None = None
    ) -> ModelOutput:
        """Hidden states [1, T, D] after the final norm, and the router statistics of every MoE layer.

        The documents of the row are given by ``cu_seqlens`` (int32 [N+1]; None: one document), or by an already
        built ``documents`` (no device-to-host sync for reading the lengths).
        """
        return self._decode(input_ids_1T, cu_seqlens, documents)

    def _decode(
        self, input_ids_1T: Tensor, cu_seqlens: Tensor | None, documents: PackedDocuments | None
    ) -> ModelOutput:
        # Shared by the public forward methods; not itself one, so that wrappers hooking those run once per call.
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
        attend = resolve_attention(self.config.attention_backend, x_TD.device.type, x_TD.dtype)
        config = self.config
        rotary = rotary_tables(docs.position_ids, config.rotary_dim, config.rope_theta, config.rope_scaling, x_TD.dtype)
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
        hidden_1TD = self._decode(input_ids_1T, cu_seqlens, documents).hidden
        return F.linear(hidden_1TD, self.output_projection_weight)

    def forward_with_head(
        self,
        input_ids_1T: Tensor,
        cu_seqlens: Tensor | None = None,
        *,
        documents: PackedDocuments | None = None,
        head: Callable[[Tensor, Tensor], HeadOutput],
    ) -> tuple[HeadOutput, list[RouterStats]]:
        """Run the decoder and apply ``head(hidden_TD, output_weight_VD)`` inside this same forward call.

        For a loss that projects the hidden states chunk by chunk (never materialising the logits). Keeping the
        head inside the forward matters to wrappers that act around forward methods (FSDP gathers the output
        weight for the duration of the forward): register this method with them.
        """
        out = self._decode(input_ids_1T, cu_seqlens, documents)
        return head(out.hidden[0], self.output_projection_weight), out.router_stats

    def init_part_names(self) -> list[str]:
        """The parts initialised independently, in order: the embedding, each layer, the final norm, the output
        projection (absent when tied). Together they cover every parameter and buffer."""
        names = ["embed_tokens", *(f"layers.{i}" for i in range(len(self.layers))), "norm"]
        return names if self.lm_head is None else [*names, "lm_head"]

    @torch.no_grad()
    def init_part(self, name: str, seed: int) -> None:
        """Initialise one part (a name of :meth:`init_part_names`) in place with a generator seeded from ``seed``
        and the part's index: normal(0, initializer_range) for matrices, ones for norms, zeros for biases.

        Writes every parameter and buffer of the part, so it also works after ``to_empty`` from the meta device.
        """
        index = self.init_part_names().index(name)
        part = self.get_submodule(name)
        subclassed = sorted({type(p).__name__ for p in part.parameters() if type(p) not in {Tensor, nn.Parameter}})
        if subclassed:
            # In-place random init of a tensor subclass (a sharded DTensor) ignores the generator: the weights would
            # be neither seeded nor those of the unsharded model. Refuse rather than initialise wrongly.
            raise TypeError(
                f"part {name!r} has {', '.join(subclassed)} parameters, which init_weights cannot initialise "
                "reproducibly; initialise a sharded model with xtrain.parallel.materialize.init_weights_sharded"
            )
        weight = next(part.parameters())
        # One generator per part: a part's weights do not depend on how many numbers other parts drew.
        generator = torch.Generator(device=weight.device).manual_seed(_part_seed(seed, index))
        std = self.config.initializer_range
        if isinstance(part, nn.Embedding | nn.Linear):
            nn.init.normal_(part.weight, mean=0.0, std=std, generator=generator)
        elif isinstance(part, RMSNorm):
            part.init_weights()
        else:
            # A decoder layer, possibly inside a wrapper class (FSDP, compile): it knows how to initialise itself.
            init_layer = getattr(part, "init_weights", None)
            if init_layer is None:
                raise TypeError(f"part {name!r} ({type(part).__name__}) has no init_weights")
            init_layer(std, generator)

    def init_weights(self, seed: int | None = None) -> None:
        """Initialise every parameter in place, part by part (see :meth:`init_part`).

        ``seed`` None draws one from the global torch RNG, so ``torch.manual_seed`` makes it deterministic too.
        """
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        for name in self.init_part_names():
            self.init_part(name, seed)


def _norm(config: ModelConfig) -> RMSNorm:
    return RMSNorm(config.hidden_size, config.rms_norm_eps, weight_before_cast=config.family == "gpt_oss")


def _part_seed(seed: int, index: int) -> int:
    # Spread consecutive seeds apart so that (seed, part) pairs never collide for small seeds and indices.
    return (seed * 1_000_003 + index * 7919 + 12345) % (2**63)


def _resolve_backend(requested: str, device: torch.device, dtype: torch.dtype) -> str:
    return select_attention_backend(requested, detect_capabilities(device, dtype))
