"""Small models and inputs shared by the sharded jobs (jobs.py) and the unsharded references the tests compute.

Everything here is plain, unsharded PyTorch: the tests build their references from it, the jobs their sharded
models, so both sides start from the same configuration and the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from xtrain.model.config import ModelConfig
from xtrain.model.moe import MoEConfig
from xtrain.model.moe.aux_loss import load_balancing_loss, router_z_loss
from xtrain.model.transformer import Transformer

TOKENS = 24
SEED = 7


def sigmoid_moe_config(*, tie: bool = False) -> ModelConfig:
    """Three layers (a dense one, then two MoE ones with the DeepSeek-V3 router and a shared expert): every kind
    of parameter and the router's fp32 buffer."""
    return ModelConfig(
        vocab_size=96,
        hidden_size=32,
        num_layers=3,
        num_attention_heads=4,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=48,
        initializer_range=0.1,
        tie_word_embeddings=tie,
        mlp_only_layers=(0,),
        moe=MoEConfig(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            router="sigmoid_group_limited",
            n_group=2,
            topk_group=1,
            num_shared_experts=1,
            init_std=0.1,
        ),
    )


def inputs_of_rank(rank: int, vocab_size: int) -> tuple[Tensor, Tensor]:
    """One packed row [1, T] of two documents, different on every rank, and its cu_seqlens."""
    generator = torch.Generator().manual_seed(1000 + rank)
    input_ids_1T = torch.randint(0, vocab_size, (1, TOKENS), generator=generator)
    return input_ids_1T, torch.tensor([0, 10, TOKENS], dtype=torch.int32)


def set_router_biases(model: Transformer) -> None:
    """Non-zero correction biases (the same on every rank), so that they take part in routing."""
    with torch.no_grad():
        for name, bias in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                bias.copy_(torch.linspace(-0.05, 0.05, bias.numel()))


def logits_head(hidden_TD: Tensor, weight_VD: Tensor) -> Tensor:
    """The head for forward_with_head that the tests compare: full logits [T, V], in fp32."""
    return (hidden_TD @ weight_VD.t()).float()


def training_loss(model: Transformer, input_ids_1T: Tensor, cu_seqlens: Tensor) -> Tensor:
    """Next-token cross-entropy plus the load-balancing and z-losses: every parameter's gradient path."""
    labels_T = torch.roll(input_ids_1T[0], -1)

    def head(hidden_TD: Tensor, weight_VD: Tensor) -> Tensor:
        return torch.nn.functional.cross_entropy((hidden_TD @ weight_VD.t()).float(), labels_T)

    ce, stats = model.forward_with_head(input_ids_1T, cu_seqlens, head=head)
    return ce + 0.1 * load_balancing_loss(stats) + 0.01 * router_z_loss(stats) if stats else ce


def unsharded(
    config: ModelConfig, seed: int, prepare: Callable[[Transformer], None] = set_router_biases
) -> Transformer:
    """The single-process reference: built on the meta device and initialised as the trainer's docs describe."""
    with torch.device("meta"):
        model = Transformer(config)
    model.to_empty(device="cpu")
    model.init_weights(seed)
    prepare(model)
    return model


def full_state(model: Transformer) -> dict[str, Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
