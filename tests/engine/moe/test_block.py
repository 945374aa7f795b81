"""MoEBlock as the model uses it: meta-device construction, deterministic init, RouterStats, bad input."""

from __future__ import annotations

import pytest
import torch
from xtrain.model.moe import MoEBlock, MoEConfig

CFG = MoEConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, num_shared_experts=1)
SIGMOID_CFG = MoEConfig(
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    router="sigmoid_group_limited",
    n_group=2,
    topk_group=1,
)


@pytest.mark.parametrize("cfg", [CFG, SIGMOID_CFG])
def test_meta_device_then_to_empty_then_deterministic_init(cfg: MoEConfig) -> None:
    with torch.device("meta"):
        block = MoEBlock(32, cfg)
    assert block.experts.gate_up_proj.is_meta
    block.to_empty(device="cpu")
    block.init_weights(torch.Generator().manual_seed(3))
    twin = MoEBlock(32, cfg)
    twin.init_weights(torch.Generator().manual_seed(3))
    for (name, a), b in zip(block.state_dict().items(), twin.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
        assert torch.isfinite(a).all(), name
    assert block.experts.gate_up_proj.std().item() == pytest.approx(cfg.init_std, rel=0.1)
    if block.router.e_score_correction_bias is not None:
        assert block.router.e_score_correction_bias.dtype == torch.float32
        assert not block.router.e_score_correction_bias.any()


def test_router_stats_carry_what_the_losses_need() -> None:
    block = MoEBlock(32, CFG)
    block.init_weights(torch.Generator().manual_seed(0))
    y, stats = block(torch.randn(20, 32))
    assert y.shape == (20, 32)
    assert stats.num_tokens == 20
    assert stats.tokens_per_expert.dtype == torch.int64 and not stats.tokens_per_expert.requires_grad
    assert int(stats.tokens_per_expert.sum()) == 20 * 2
    assert stats.router_prob_sum.shape == (8,) and stats.router_prob_sum.requires_grad
    assert stats.router_prob_sum.sum().item() == pytest.approx(20.0, rel=1e-5)  # probabilities sum to 1 per token
    assert stats.z_loss_sum.dim() == 0 and stats.z_loss_sum.requires_grad


def test_shared_experts_are_added_to_routed_output() -> None:
    block = MoEBlock(32, CFG)
    block.init_weights(torch.Generator().manual_seed(0))
    x = torch.randn(6, 32)
    y, _ = block(x)
    assert block.shared_experts is not None
    routing = block.router(x)
    counts = torch.bincount(routing.experts.reshape(-1), minlength=8)
    routed = block.experts(x, routing.weights, routing.experts, counts)
    assert torch.allclose(y, routed + block.shared_experts(x), atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_tokens_at_all(dtype: torch.dtype) -> None:
    from xtrain.model.moe.aux_loss import load_balancing_loss, router_z_loss

    block = MoEBlock(32, CFG).to(dtype)
    block.init_weights(torch.Generator().manual_seed(0))
    x = torch.zeros(0, 32, dtype=dtype, requires_grad=True)
    y, stats = block(x)
    y.sum().backward()
    assert y.shape == (0, 32) and x.grad is not None and x.grad.shape == (0, 32)
    assert load_balancing_loss([stats]).item() == 0.0 and router_z_loss([stats]).item() == 0.0


def test_wrong_input_shape_is_a_clear_error() -> None:
    block = MoEBlock(32, CFG)
    with pytest.raises(ValueError, match=r"expects x of shape \[T, 32\]"):
        block(torch.zeros(1, 4, 32))


@pytest.mark.slow
def test_torch_compile_of_the_block_matches_eager_in_fp32() -> None:
    block = MoEBlock(32, CFG)
    block.init_weights(torch.Generator().manual_seed(0))
    x = torch.randn(24, 32)
    x_eager = x.clone().requires_grad_(True)
    y_eager, _ = block(x_eager)
    y_eager.sum().backward()
    # aot_eager traces with fake tensors like inductor does (where fp32 grouped_mm is refused) without
    # spending CI time on C++ code generation; test_grouped_mm covers inductor on the op itself.
    compiled = torch.compile(block, backend="aot_eager")
    x_comp = x.clone().requires_grad_(True)
    y_comp, _ = compiled(x_comp)
    y_comp.sum().backward()
    assert x_eager.grad is not None and x_comp.grad is not None
    assert torch.allclose(y_comp, y_eager, atol=1e-5)
    assert torch.allclose(x_comp.grad, x_eager.grad, atol=1e-5)


def test_correction_bias_stays_fp32_when_the_block_goes_bf16() -> None:
    block = MoEBlock(32, SIGMOID_CFG)
    block.init_weights(torch.Generator().manual_seed(0))
    assert block.router.e_score_correction_bias is not None
    block.router.e_score_correction_bias.copy_(torch.linspace(-1e-3, 1e-3, 8) + 1.0)
    before = block.router.e_score_correction_bias.clone()
    block = block.to(torch.bfloat16)
    assert block.experts.down_proj.dtype == torch.bfloat16
    assert block.router.e_score_correction_bias.dtype == torch.float32
    assert torch.equal(block.router.e_score_correction_bias, before)
    assert "router.e_score_correction_bias" in block.state_dict()
    y, _ = block(torch.randn(5, 32, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16
