"""Load-balancing loss (global over micro-batches) and router z-loss."""

from __future__ import annotations

import pytest
import torch
from xtrain.model.moe import MoEBlock, MoEConfig, RouterStats
from xtrain.model.moe.aux_loss import load_balancing_loss, router_z_loss
from xtrain.model.moe.router import update_expert_bias

from tests.engine.moe.hf_reference import build_qwen3_pair


def _layers(num_layers: int, experts: int = 8, top_k: int = 2, hidden: int = 16) -> list[MoEBlock]:
    cfg = MoEConfig(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=8, init_std=0.3)
    gen = torch.Generator().manual_seed(7)
    blocks = []
    for _ in range(num_layers):
        block = MoEBlock(hidden, cfg)
        block.init_weights(gen)
        blocks.append(block)
    return blocks


def _stats(blocks: list[MoEBlock], x: torch.Tensor) -> list[RouterStats]:
    return [block(x)[1] for block in blocks]


def test_single_layer_matches_transformers_load_balancing_loss() -> None:
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    experts, top_k = 8, 2
    _, ours = build_qwen3_pair(hidden=16, experts=experts, top_k=top_k, inter=8, norm_topk_prob=True)
    x = torch.randn(50, 16)
    _, stats = ours(x)
    logits = x @ ours.router.weight.detach().t()
    want = load_balancing_loss_func((logits,), experts, top_k)
    assert torch.allclose(load_balancing_loss([stats]), want, rtol=1e-5)


def test_several_layers_relation_to_transformers() -> None:
    """transformers multiplies layer-averaged counts by layer-averaged probabilities; xtrain averages the
    per-layer losses (each layer balanced on its own). The two agree through their definitions."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    blocks = _layers(3)
    x = torch.randn(40, 16)
    stats = _stats(blocks, x)
    logits = tuple(x @ b.router.weight.detach().t() for b in blocks)
    hf = load_balancing_loss_func(logits, 8, 2)
    counts = torch.stack([s.tokens_per_expert.float() for s in stats]) / 40
    probs = torch.stack([s.router_prob_sum for s in stats]) / 40
    assert torch.allclose(hf, 8 * (counts.mean(0) * probs.mean(0)).sum(), rtol=1e-5)
    assert torch.allclose(load_balancing_loss(stats), 8 * (counts * probs).sum(-1).mean(), rtol=1e-5)
    assert not torch.allclose(load_balancing_loss(stats), hf, rtol=1e-3)


def test_micro_batch_shares_sum_to_the_global_batch_loss() -> None:
    blocks = _layers(2)
    torch.manual_seed(0)
    micro = [torch.randn(n, 16) for n in (13, 40, 7)]  # unequal micro-batches, as packing produces

    whole = _stats(blocks, torch.cat(micro))
    whole_loss = load_balancing_loss(whole)
    whole_z = router_z_loss(whole)
    whole_grad = torch.autograd.grad(whole_loss + whole_z, [b.router.weight for b in blocks])

    per_micro = [_stats(blocks, x) for x in micro]
    global_counts = sum(torch.stack([s.tokens_per_expert for s in st]) for st in per_micro)
    assert isinstance(global_counts, torch.Tensor)
    global_tokens = sum(x.shape[0] for x in micro)
    shares = [load_balancing_loss(st, global_counts, global_tokens) for st in per_micro]
    z_shares = [router_z_loss(st, global_tokens) for st in per_micro]
    assert torch.allclose(torch.stack(shares).sum(), whole_loss, rtol=1e-5)
    assert torch.allclose(torch.stack(z_shares).sum(), whole_z, rtol=1e-5)
    share_grad = torch.autograd.grad(
        torch.stack(shares).sum() + torch.stack(z_shares).sum(), [b.router.weight for b in blocks]
    )
    for got, want in zip(share_grad, whole_grad, strict=True):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-7)

    # The naive per-micro-batch average is a different (biased) quantity.
    naive = torch.stack([load_balancing_loss(st) for st in per_micro]).mean()
    assert abs(naive.item() - whole_loss.item()) > 1e-3 * whole_loss.item()


def test_z_loss_is_mean_logsumexp_squared() -> None:
    blocks = _layers(1)
    x = torch.randn(30, 16)
    logits = x @ blocks[0].router.weight.detach().t()
    want = sum(float(torch.log(torch.exp(row).sum())) ** 2 for row in logits) / 30
    assert router_z_loss(_stats(blocks, x)).item() == pytest.approx(want, rel=1e-5)


def test_bad_arguments_name_the_fix() -> None:
    stats = _stats(_layers(2), torch.randn(4, 16))
    with pytest.raises(ValueError, match="both"):
        load_balancing_loss(stats, torch.zeros(2, 8))
    with pytest.raises(ValueError, match=r"expected \[layers, experts\]"):
        load_balancing_loss(stats, torch.zeros(3, 8), 4)
    with pytest.raises(ValueError, match="no RouterStats"):
        router_z_loss([])


def test_expert_bias_update_moves_towards_balance() -> None:
    bias = torch.zeros(4)
    update_expert_bias(bias, torch.tensor([10, 2, 4, 0]), rate=0.01)  # mean 4
    assert torch.equal(bias, torch.tensor([-0.01, 0.01, 0.0, 0.01]))
