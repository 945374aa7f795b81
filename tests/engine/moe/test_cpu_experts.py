"""The CPU's fused expert loop against the grouped-matmul composition (same matmuls), and how the block picks
its path: the automatic choice per device and dtype, and the forcing key (docs/engine-moe.md, "Which path")."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from xtrain.model.moe import MoEBlock, MoEConfig
from xtrain.model.moe.config import ExpertsImpl
from xtrain.model.moe.experts import GroupedExperts, choose_experts_path
from xtrain.model.moe.grouped_mm import GroupedImpl, has_torch_grouped_mm

pytestmark = pytest.mark.skipif(not has_torch_grouped_mm(), reason="this torch has no grouped_mm")


def _run(block: MoEBlock, x: torch.Tensor, probe: torch.Tensor, *, fused: bool) -> dict[str, torch.Tensor | None]:
    impl: ExpertsImpl = "cpu_fused" if fused else "grouped_mm"
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
    assert block.experts.path_for(probe_x) == "cpu_fused"
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
        if dtype == torch.float32:  # the same matmuls and elementwise ops in the same order: the same bits
            assert torch.equal(got, want), name
        assert torch.allclose(got.float(), want.float(), atol=tol, rtol=tol), name
    grad_gate_up = fused["gate_up"]
    if tokens * top_k < experts and grad_gate_up is not None:  # experts without rows get zero weight gradients
        assert bool((grad_gate_up.flatten(1).abs().sum(1) == 0).any())


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


def _experts(impl: ExpertsImpl = "auto", inter: int = 16) -> GroupedExperts:
    cfg = MoEConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=inter, experts_impl=impl)
    experts = MoEBlock(32, cfg).experts
    assert isinstance(experts, GroupedExperts)
    return experts


@pytest.mark.parametrize(
    ("dtype", "want"),
    [
        (torch.float32, "cpu_fused"),
        (torch.bfloat16, "cpu_fused"),
        (torch.float16, "cpu_fused"),
        (torch.float64, "loop"),
    ],
)
def test_auto_on_the_cpu_picks_what_the_documentation_says(dtype: torch.dtype, want: str) -> None:
    """docs/engine-moe.md's table, CPU rows: the fused loop in eager mode for fp32/bf16/fp16, the loop for fp64."""
    experts = _experts().to(dtype)
    assert experts.path_for(torch.zeros(4, 32, dtype=dtype)) == want


def test_auto_with_rows_the_kernel_cannot_take_is_the_loop() -> None:
    experts = _experts(inter=6)  # 6 fp32 = 24-byte rows: the grouped kernel needs 16-byte multiples
    assert experts.path_for(torch.zeros(4, 32)) == "loop"


@pytest.mark.parametrize(
    ("requested", "grouped", "fusable", "want"),
    [
        ("auto", "grouped_mm", True, "cpu_fused"),  # CPU, eager, whole experts
        ("auto", "grouped_mm", False, "grouped_mm"),  # CUDA bf16 (cc >= 8.0), torch.compile, expert parallelism
        ("auto", "loop", False, "loop"),  # CUDA fp32, older GPUs, unaligned shapes
        ("auto", "loop", True, "loop"),  # CPU fp64, unaligned shapes
        ("grouped_mm", "grouped_mm", True, "grouped_mm"),
        ("loop", "loop", True, "loop"),
        ("cpu_fused", "loop", True, "cpu_fused"),
    ],
)
def test_the_choice_table(requested: ExpertsImpl, grouped: GroupedImpl, fusable: bool, want: str) -> None:
    assert choose_experts_path(requested, grouped=grouped, fusable=fusable) == want


def test_every_forced_path_runs_and_agrees() -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(50, 32, generator=gen)
    outputs = {}
    for impl in ("cpu_fused", "grouped_mm", "loop"):
        cfg = MoEConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, experts_impl=impl)
        block = MoEBlock(32, cfg)
        block.init_weights(torch.Generator().manual_seed(0))
        assert block.experts.path_for(x) == impl
        outputs[impl] = block(x)[0]
    assert torch.allclose(outputs["cpu_fused"], outputs["grouped_mm"], atol=1e-6)
    assert torch.allclose(outputs["loop"], outputs["grouped_mm"], atol=1e-6)


def test_forced_cpu_fused_where_it_cannot_run_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match=r"experts_impl='cpu_fused' cannot run here .*use experts_impl='auto'"):
        choose_experts_path("cpu_fused", grouped="grouped_mm", fusable=False, where="cuda")
    cfg = MoEConfig(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8, router="topk_softmax", expert_bias=True,
        expert_activation="clamped_swiglu", router_bias=True, experts_impl="cpu_fused",
    )  # fmt: skip
    block = MoEBlock(16, cfg)
    block.init_weights(torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"cannot run here \(BiasedExperts on cpu"):
        block(torch.randn(3, 16))


def test_an_unknown_experts_impl_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValidationError) as info:
        MoEConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8, experts_impl="fused")  # type: ignore[arg-type]
    assert "experts_impl" in str(info.value) and "'cpu_fused'" in str(info.value)
