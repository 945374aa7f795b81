"""Sigmoid group-limited router + shared experts against transformers' DeepSeek-V3 MoE block (fp32)."""

from __future__ import annotations

import pytest
import torch

from tests.engine.moe.hf_reference import build_deepseek_pair, rel_err


@pytest.mark.parametrize(
    "case",
    [
        (48, 16, 4, 4, 2, 1),
        (48, 16, 4, 1, 1, 2),
        (3, 32, 6, 8, 3, 1),  # more experts than tokens
    ],
)
@pytest.mark.parametrize("impl", ["auto", "grouped_mm"])  # auto: the fused CPU loop here
def test_matches_deepseek_v3_moe(case: tuple[int, int, int, int, int, int], impl: str) -> None:
    tokens, experts, top_k, n_group, topk_group, n_shared = case
    hidden, inter = 32, 16
    hf, ours = build_deepseek_pair(
        hidden=hidden,
        experts=experts,
        top_k=top_k,
        inter=inter,
        n_group=n_group,
        topk_group=topk_group,
        n_shared=n_shared,
        experts_impl=impl,
    )
    torch.manual_seed(3)
    bias = torch.randn(experts) * 0.3
    hf.gate.e_score_correction_bias.copy_(bias)
    ours.router.e_score_correction_bias.copy_(bias)  # type: ignore[union-attr]
    x = torch.randn(tokens, hidden)
    probe = torch.randn(tokens, hidden)

    x_hf = x.clone().requires_grad_(True)
    y_hf = hf(x_hf.unsqueeze(0)).squeeze(0)
    (y_hf * probe).sum().backward()
    x_ours = x.clone().requires_grad_(True)
    y_ours, _ = ours(x_ours)
    (y_ours * probe).sum().backward()

    assert (y_ours - y_hf).abs().max().item() <= 1e-5
    assert x_hf.grad is not None and x_ours.grad is not None
    assert rel_err(x_ours.grad, x_hf.grad) <= 1e-4
    pairs = {
        "router": (ours.router.weight, hf.gate.weight),
        "gate_up": (ours.experts.gate_up_proj, hf.experts.gate_up_proj),
        "down": (ours.experts.down_proj, hf.experts.down_proj),
        "shared_gate": (ours.shared_experts.gate_proj.weight, hf.shared_experts.gate_proj.weight),  # type: ignore[union-attr]
        "shared_down": (ours.shared_experts.down_proj.weight, hf.shared_experts.down_proj.weight),  # type: ignore[union-attr]
    }
    for name, (p_ours, p_hf) in pairs.items():
        assert p_ours.grad is not None and p_hf.grad is not None, name
        assert rel_err(p_ours.grad, p_hf.grad) <= 1e-4, name


def test_correction_bias_changes_selection_not_weights() -> None:
    hidden, experts, top_k = 32, 16, 4
    hf, ours = build_deepseek_pair(
        hidden=hidden, experts=experts, top_k=top_k, inter=16, n_group=4, topk_group=2, n_shared=1
    )
    x = torch.randn(64, hidden)
    before = ours.router(x)
    # A large bias on expert 5 forces it into every token's selection (as in transformers' router) ...
    bias = torch.zeros(experts)
    bias[5] = 100.0
    ours.router.e_score_correction_bias.copy_(bias)  # type: ignore[union-attr]
    hf.gate.e_score_correction_bias.copy_(bias)
    after = ours.router(x)
    _, hf_weights, hf_experts = hf.gate(x)
    assert bool((after.experts == 5).any(dim=1).all())
    assert not bool((before.experts == 5).any(dim=1).all())
    assert torch.equal(after.experts.sort(dim=1).values, hf_experts.sort(dim=1).values)
    # ... but the weight of a selected expert is still computed from the unbiased sigmoid score.
    scores = torch.sigmoid(x @ ours.router.weight.detach().t())
    raw = scores.gather(1, after.experts)
    want = raw / raw.sum(dim=1, keepdim=True) * ours.config.routed_scaling_factor
    assert torch.allclose(after.weights, want, atol=1e-6)
    order_ours = after.experts.argsort(dim=1)
    order_hf = hf_experts.argsort(dim=1)
    assert torch.allclose(after.weights.gather(1, order_ours), hf_weights.gather(1, order_hf), atol=1e-6)
    y_ours, _ = ours(x)
    assert (y_ours - hf(x.unsqueeze(0)).squeeze(0)).abs().max().item() <= 1e-5
