"""The CPU's fused expert loop against the grouped-matmul composition it replaces there (same matmuls)."""

from __future__ import annotations

import pytest
import torch
from xtrain.model.moe import MoEBlock, MoEConfig
from xtrain.model.moe.config import ExpertsImpl
from xtrain.model.moe.grouped_mm import has_torch_grouped_mm

pytestmark = pytest.mark.skipif(not has_torch_grouped_mm(), reason="this torch has no grouped_mm")


def _run(block: MoEBlock, x: torch.Tensor, probe: torch.Tensor, *, fused: bool) -> dict[str, torch.Tensor | None]:
    impl: ExpertsImpl = "cpu_fused" if fused else "auto"
    block.experts.config = block.experts.config.model_copy(update={"experts_impl": impl})
    block.zero_grad(set_to_none=True)
    xg = x.detach().clone().requires_grad_(True)
    y, _ = block(xg)
    (y.float() * probe).sum().backward()
    return {
        "y": y.detach(),
        "grad_x": xg.grad,
        "router": block.router.weight.grad,
        "gate_up": block.experts.gate_up_proj.grad,
        "down": block.experts.down_proj.grad,
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "experts", "top_k"), [(64, 8, 2), (5, 16, 4), (700, 16, 8), (0, 8, 2)])
def test_fused_cpu_path_matches_grouped_composition(dtype: torch.dtype, tokens: int, experts: int, top_k: int) -> None:
    cfg = MoEConfig(
        num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=16, norm_topk_prob=True,
        experts_impl="cpu_fused",
    )  # fmt: skip
    block = MoEBlock(32, cfg).to(dtype)
    block.init_weights(torch.Generator().manual_seed(0))
    probe_x = torch.zeros(1, 32, dtype=dtype)
    assert block.experts.fused_cpu(probe_x, block.experts.impl_for(probe_x))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, 32, generator=gen).to(dtype)
    probe = torch.randn(tokens, 32, generator=gen)
    fused = _run(block, x, probe, fused=True)
    grouped = _run(block, x, probe, fused=False)
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    for name, want in grouped.items():
        got = fused[name]
        assert got is not None and want is not None, name
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.allclose(got.float(), want.float(), atol=tol, rtol=tol), name
    grad_gate_up = fused["gate_up"]
    if tokens * top_k < experts and grad_gate_up is not None:  # experts without rows get zero weight gradients
        assert bool((grad_gate_up.flatten(1).abs().sum(1) == 0).any())


def test_the_default_fast_path_is_grouped_mm_and_cpu_fused_is_opt_in() -> None:
    """The issue's rule: no Python loop over experts in the default fast path; the CPU loop runs only when asked."""
    x = torch.zeros(4, 32)
    default = MoEBlock(32, MoEConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16)).experts
    assert default.impl_for(x) == "grouped_mm" and not default.fused_cpu(x, default.impl_for(x))
    opted = MoEBlock(
        32, MoEConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, experts_impl="cpu_fused")
    ).experts
    assert opted.fused_cpu(x, opted.impl_for(x))


def test_fused_cpu_path_with_frozen_experts_and_no_input_grad() -> None:
    cfg = MoEConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, experts_impl="cpu_fused")
    block = MoEBlock(32, cfg)
    block.init_weights(torch.Generator().manual_seed(0))
    block.experts.requires_grad_(False)
    x = torch.randn(40, 32)
    y, _ = block(x)  # x without grad: only the router's weight (through the routing weights) gets one
    y.sum().backward()
    assert block.router.weight.grad is not None and block.experts.gate_up_proj.grad is None
    x_grad = x.clone().requires_grad_(True)
    block.router.requires_grad_(False)
    y2, _ = block(x_grad)
    y2.sum().backward()
    assert x_grad.grad is not None and torch.allclose(y2, y)
