"""The model and losses the expert-parallel jobs train, and how they build it under each layout.

Plain model code plus the parallel steps, applied in the trainer's order (meta device → expert parallelism →
activation checkpointing → FSDP2 → materialise); ep_size 1 is the plain FSDP model the EP layouts are compared with.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor
from xtrain.config import ParallelSection
from xtrain.model.config import ModelConfig
from xtrain.model.moe import MoEConfig
from xtrain.model.moe.aux_loss import load_balancing_loss, router_z_loss
from xtrain.model.transformer import Transformer
from xtrain.parallel.all_to_all import CommObserver
from xtrain.parallel.checkpointing import apply_activation_checkpointing
from xtrain.parallel.expert_parallel import apply_expert_parallel
from xtrain.parallel.fsdp import apply_fsdp
from xtrain.parallel.layout import check_layout
from xtrain.parallel.materialize import materialize, unwrapped_names
from xtrain.parallel.mesh import model_meshes
from xtrain.parallel.tensors import full_tensor

TOKENS = 24
SEED = 5


def moe_config(*, router: str = "sigmoid_group_limited", biased: bool = False, experts: int = 8) -> ModelConfig:
    """A dense layer then two MoE layers of eight experts (top-2, a shared expert with the sigmoid router)."""
    sigmoid = router == "sigmoid_group_limited"
    return ModelConfig(
        vocab_size=96,
        hidden_size=32,
        num_layers=3,
        num_attention_heads=4,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=48,
        initializer_range=0.1,
        mlp_only_layers=(0,),
        moe=MoEConfig(
            num_experts=experts,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            router=router,  # type: ignore[arg-type]  # one of the router literals
            n_group=2 if sigmoid else 1,
            topk_group=1,
            num_shared_experts=1 if sigmoid else 0,
            expert_bias=biased,
            router_bias=biased,
            init_std=0.1,
        ),
    )


def build(
    config: ModelConfig,
    ep_size: int = 1,
    *,
    domino_slices: int = 1,
    observer: CommObserver | None = None,
    prepare: Callable[[Transformer], None] | None = None,
    checkpointing: str = "none",
    replicate: int = 1,
) -> Transformer:
    """The model on all ranks (one node) under ``ep_size`` and ``replicate`` (HSDP replicas)."""
    num_experts = config.moe.num_experts if config.moe is not None else None
    parallel = ParallelSection(replicate=replicate, ep_size=ep_size)
    layout = check_layout(parallel, dist.get_world_size(), num_experts=num_experts)
    meshes = model_meshes(layout, "cpu")
    with torch.device("meta"):
        model = Transformer(config)
    if meshes.expert is not None:
        apply_expert_parallel(model, meshes.expert, domino_slices=domino_slices, observer=observer)
    apply_activation_checkpointing(model, checkpointing)
    apply_fsdp(model, meshes.dense, param_dtype=torch.float32, expert_mesh=meshes.expert_shard)
    materialize(model, torch.device("cpu"), seed=SEED)
    if prepare is not None:
        prepare(model)
    return model


def inputs_of_rank(rank: int, vocab_size: int, tokens: int = TOKENS) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(300 + rank)
    input_ids_1T = torch.randint(0, vocab_size, (1, tokens), generator=generator)
    return input_ids_1T, torch.tensor([0, tokens // 2, tokens], dtype=torch.int32)


def global_losses(model: Transformer, input_ids_1T: Tensor, cu_seqlens: Tensor) -> dict[str, Tensor]:
    """This rank's share of the global-batch losses: cross-entropy over the global token count, the
    load-balancing loss with the counts of every rank's tokens (all-reduced over all ranks: the ranks of an ep
    group route different tokens, so all ranks make the global batch), and the z-loss."""
    world = dist.get_world_size()
    labels_T = torch.roll(input_ids_1T[0], -1)
    global_tokens = labels_T.numel() * world

    def head(hidden_TD: Tensor, weight_VD: Tensor) -> Tensor:
        logits = (hidden_TD @ weight_VD.t()).float()
        return torch.nn.functional.cross_entropy(logits, labels_T, reduction="sum") / global_tokens

    ce, stats = model.forward_with_head(input_ids_1T, cu_seqlens, head=head)
    local_counts_LE = torch.stack([s.tokens_per_expert for s in stats]).double()
    counts_LE = local_counts_LE.clone()
    dist.all_reduce(counts_LE)
    balance = load_balancing_loss(stats, counts_LE, global_tokens)
    z = router_z_loss(stats, global_num_tokens=global_tokens)
    return {
        "ce": ce,
        "balance": balance,
        "z": z,
        "total": ce + 0.1 * balance + 0.01 * z,
        "counts": counts_LE,
        "local counts": local_counts_LE,
    }


def full_gradients(model: Transformer) -> dict[str, Tensor]:
    """Every parameter's gradient in full (a collective), keyed as the unwrapped model keys its parameters."""
    grads = {name: full_tensor(p.grad).clone() for name, p in model.named_parameters() if p.grad is not None}
    return unwrapped_names(grads)


def step_results(model: Transformer, input_ids_1T: Tensor, cu_seqlens: Tensor) -> dict[str, object]:
    """Forward, backward (the loss times the world size, as the trainer does for FSDP's averaging), and the
    global losses summed over ranks and the full gradients."""
    losses = global_losses(model, input_ids_1T, cu_seqlens)
    (losses["total"] * dist.get_world_size()).backward()  # type: ignore[no-untyped-call]  # torch leaves it untyped
    summed = torch.stack([losses[k].detach().double() for k in ("ce", "balance", "z")])
    dist.all_reduce(summed)
    return {
        "losses": summed,
        "grads": full_gradients(model),
        "counts": losses["counts"],
        "local counts": losses["local counts"],
    }
