"""xtrain's MoE block against transformers' Qwen3-MoE sparse block holding the same weights (fp32)."""

from __future__ import annotations

import pytest
import torch

from tests.engine.moe.hf_reference import build_qwen3_pair, rel_err


@pytest.mark.parametrize("norm_topk_prob", [True, False])
@pytest.mark.parametrize(
    ("tokens", "experts", "top_k", "impl"),
    [
        (64, 8, 2, "grouped_mm"),
        (64, 8, 2, "loop"),
        (5, 16, 4, "grouped_mm"),  # more experts than tokens: most experts get no token
        (3, 32, 8, "loop"),
        (600, 16, 8, "grouped_mm"),  # 4800 slots: crosses the CPU's piecewise boundaries
        (64, 8, 2, "auto"),  # the fused CPU loop, the default here
        (5, 16, 4, "cpu_fused"),
        (600, 16, 8, "cpu_fused"),
    ],
)
def test_matches_qwen3_moe_block(norm_topk_prob: bool, tokens: int, experts: int, top_k: int, impl: str) -> None:
    hidden, inter = 32, 16
    hf, ours = build_qwen3_pair(
        hidden=hidden, experts=experts, top_k=top_k, inter=inter, norm_topk_prob=norm_topk_prob, experts_impl=impl
    )
    torch.manual_seed(1)
    x = torch.randn(tokens, hidden)
    probe = torch.randn(tokens, hidden)

    y_hf = hf(x.clone().unsqueeze(0)).squeeze(0)
    y_ours, stats = ours(x.clone())
    assert (y_ours - y_hf).abs().max().item() <= 1e-5
    assert int(stats.tokens_per_expert.sum()) == tokens * top_k
    if tokens * top_k < experts:
        assert (stats.tokens_per_expert == 0).any()

    x_hf = x.clone().requires_grad_(True)
    (hf(x_hf.unsqueeze(0)).squeeze(0) * probe).sum().backward()
    x_ours = x.clone().requires_grad_(True)
    (ours(x_ours)[0] * probe).sum().backward()
    assert x_hf.grad is not None and x_ours.grad is not None
    assert rel_err(x_ours.grad, x_hf.grad) <= 1e-4
    pairs = {
        "router": (ours.router.weight, hf.gate.weight),
        "gate_up": (ours.experts.gate_up_proj, hf.experts.gate_up_proj),
        "down": (ours.experts.down_proj, hf.experts.down_proj),
    }
    for name, (p_ours, p_hf) in pairs.items():
        assert p_ours.grad is not None and p_hf.grad is not None, name
        assert rel_err(p_ours.grad, p_hf.grad) <= 1e-4, name


def test_sum_backward_with_stride_zero_gradient_matches_reference() -> None:
    """`y.sum().backward()` hands a stride-0 gradient to the block; torch's CPU grouped_mm backward alone
    rejects it."""
    hf, ours = build_qwen3_pair(hidden=32, experts=8, top_k=2, inter=16, norm_topk_prob=True, experts_impl="grouped_mm")
    assert ours.experts.path_for(torch.zeros(1, 32)) == "grouped_mm"
    x = torch.randn(40, 32)
    x_hf = x.clone().requires_grad_(True)
    hf(x_hf.unsqueeze(0)).sum().backward()
    x_ours = x.clone().requires_grad_(True)
    ours(x_ours)[0].sum().backward()
    assert x_hf.grad is not None and x_ours.grad is not None
    assert rel_err(x_ours.grad, x_hf.grad) <= 1e-4
    assert ours.experts.down_proj.grad is not None and hf.experts.down_proj.grad is not None
    assert rel_err(ours.experts.down_proj.grad, hf.experts.down_proj.grad) <= 1e-4


def test_bf16_is_as_accurate_as_transformers_bf16() -> None:
    """bf16 takes other code paths (gather+sum combine accumulating in fp32, piecewise over tokens): against
    transformers in fp32, xtrain in bf16 must be about as close as transformers in bf16."""
    hf, ours = build_qwen3_pair(hidden=32, experts=16, top_k=8, inter=16, norm_topk_prob=True)
    torch.manual_seed(5)
    x = torch.randn(600, 32)  # 4800 slots: several pieces
    probe = torch.randn(600, 32)

    def run(module: torch.nn.Module, dtype: torch.dtype, is_hf: bool) -> tuple[torch.Tensor, torch.Tensor]:
        module = module.to(dtype)
        xi = x.to(dtype).detach().clone().requires_grad_(True)
        y = module(xi.unsqueeze(0)).squeeze(0) if is_hf else module(xi)[0]
        (y * probe.to(dtype)).sum().backward()
        assert xi.grad is not None
        return y.detach().float(), xi.grad.float()

    y_ref, gx_ref = run(hf, torch.float32, True)
    hf.zero_grad()
    y_hf, gx_hf = run(hf, torch.bfloat16, True)
    y_ours, gx_ours = run(ours, torch.bfloat16, False)
    assert rel_err(y_ours, y_ref) <= 1.5 * rel_err(y_hf, y_ref) + 1e-3
    assert rel_err(gx_ours, gx_ref) <= 1.5 * rel_err(gx_hf, gx_ref) + 1e-3
    assert rel_err(y_ours, y_ref) <= 2e-2
