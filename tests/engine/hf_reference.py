"""Tiny random Hugging Face Qwen3 / Qwen3-MoE models built with transformers itself: the reference the
parity tests compare xtrain against. Everything runs offline, in fp32, with transformers' eager attention
and eager experts."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM


@dataclass(frozen=True)
class TinyModel:
    """Shape of a tiny reference model (the defaults give a 3-layer model of a few hundred K parameters)."""

    moe: bool
    heads: int = 4
    kv_heads: int = 2
    tie: bool = False
    num_layers: int = 3
    num_experts: int = 8
    top_k: int = 2
    norm_topk_prob: bool = True
    mlp_only_layers: tuple[int, ...] = ()
    decoder_sparse_step: int = 1
    vocab_size: int = 128
    hidden_size: int = 64
    head_dim: int = 16
    extra: dict[str, Any] = field(default_factory=dict)


def build_reference(shape: TinyModel, seed: int) -> Qwen3ForCausalLM | Qwen3MoeForCausalLM:
    """A random HF model whose weights are all far from their init values (norm weights included), so a
    mistake anywhere in xtrain shows in the logits, not only in the larger matrices."""
    common: dict[str, Any] = {
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": 96,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "tie_word_embeddings": shape.tie,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "initializer_range": 0.1,
        "attn_implementation": "eager",
        **shape.extra,
    }
    torch.manual_seed(seed)
    model: Qwen3ForCausalLM | Qwen3MoeForCausalLM
    if shape.moe:
        config = Qwen3MoeConfig(
            **common,
            num_experts=shape.num_experts,
            num_experts_per_tok=shape.top_k,
            moe_intermediate_size=32,
            norm_topk_prob=shape.norm_topk_prob,
            mlp_only_layers=list(shape.mlp_only_layers),
            decoder_sparse_step=shape.decoder_sparse_step,
            experts_implementation="eager",
        )
        model = Qwen3MoeForCausalLM(config)
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**common))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
    return model.float().eval()


def save_reference(model: Qwen3ForCausalLM | Qwen3MoeForCausalLM, folder: Path) -> Path:
    model.save_pretrained(folder)
    return folder


def hf_gradients_in_hub_layout(model: Qwen3ForCausalLM | Qwen3MoeForCausalLM) -> dict[str, torch.Tensor]:
    """HF parameter gradients under the keys and per-expert layout of the checkpoint files.

    transformers 5 keeps the experts of a layer fused in memory (gate_up_proj [E, 2F, D], gate rows first;
    down_proj [E, D, F]) and splits them per expert when it saves; the split is redone here by hand.
    """
    grads: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        grad = torch.zeros_like(param) if param.grad is None else param.grad
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name.removesuffix("gate_up_proj")
            half = grad.shape[1] // 2
            for e in range(grad.shape[0]):
                grads[f"{prefix}{e}.gate_proj.weight"] = grad[e, :half]
                grads[f"{prefix}{e}.up_proj.weight"] = grad[e, half:]
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name.removesuffix("down_proj")
            for e in range(grad.shape[0]):
                grads[f"{prefix}{e}.down_proj.weight"] = grad[e]
        else:
            grads[name] = grad
    return grads
