"""Grouped matmul dispatch: torch's kernel vs the per-expert fallback, and the two known CPU catches."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from xtrain.model.moe import MoEBlock, MoEConfig
from xtrain.model.moe.grouped_mm import grouped_mm, grouped_mm_supported, has_torch_grouped_mm, resolve_impl

pytestmark = pytest.mark.skipif(not has_torch_grouped_mm(), reason="this torch has no grouped_mm")


def _reference(x: torch.Tensor, w: torch.Tensor, counts: list[int]) -> torch.Tensor:
    return torch.cat([chunk @ w[g] for g, chunk in enumerate(torch.split(x, counts))])


def _case(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    counts = [5, 0, 11, 0, 0, 7, 1, 0]  # uneven and empty groups, empty last ones included
    torch.manual_seed(0)
    x = torch.randn(sum(counts), 16, dtype=dtype)
    w = torch.randn(len(counts), 16, 24, dtype=dtype)
    offsets = torch.tensor(counts).cumsum(0).to(torch.int32)
    return x, w, offsets, counts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("impl", ["grouped_mm", "loop"])
def test_forward_and_backward_match_per_group_matmul(dtype: torch.dtype, impl: str) -> None:
    x, w, offsets, counts = _case(dtype)
    probe = torch.randn(x.shape[0], w.shape[-1], dtype=dtype)
    xa, wa = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    (grouped_mm(xa, wa, offsets, impl) * probe).sum().backward()  # type: ignore[arg-type]
    xb, wb = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    (_reference(xb, wb, counts) * probe).sum().backward()
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert torch.allclose(grouped_mm(x, w, offsets, impl), _reference(x, w, counts), atol=tol, rtol=tol)  # type: ignore[arg-type]
    assert xa.grad is not None and xb.grad is not None and wa.grad is not None and wb.grad is not None
    assert torch.allclose(xa.grad, xb.grad, atol=tol, rtol=tol)
    assert torch.allclose(wa.grad, wb.grad, atol=tol, rtol=tol)
    assert bool((wa.grad[1] == 0).all()), "an empty group's weight gradient must be zero"


def test_stride_zero_gradient_catch_is_handled() -> None:
    x, w, offsets, counts = _case(torch.float32)
    # The catch itself: torch's kernel rejects the expanded gradient of `.sum()`.
    raw = F.grouped_mm(x.clone().requires_grad_(True), w.clone().requires_grad_(True), offs=offsets)
    with pytest.raises(RuntimeError):
        raw.sum().backward()
    xa, wa = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    grouped_mm(xa, wa, offsets).sum().backward()
    xb, wb = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    _reference(xb, wb, counts).sum().backward()
    assert xa.grad is not None and xb.grad is not None and wa.grad is not None and wb.grad is not None
    assert torch.allclose(xa.grad, xb.grad, atol=1e-5) and torch.allclose(wa.grad, wb.grad, atol=1e-5)


def test_no_rows_at_all() -> None:
    w = torch.randn(4, 16, 8, requires_grad=True)
    offsets = torch.zeros(4, dtype=torch.int32)
    for impl in ("grouped_mm", "loop"):
        out = grouped_mm(torch.zeros(0, 16), w, offsets, impl)  # type: ignore[arg-type]
        assert out.shape == (0, 8)


def test_auto_falls_back_where_the_kernel_cannot_run() -> None:
    x = torch.randn(4, 6)
    w_unaligned = torch.randn(2, 6, 5)  # 5 fp32 = 20-byte rows: the kernel needs 16-byte multiples
    assert not grouped_mm_supported(x, w_unaligned)
    assert resolve_impl("auto", x, w_unaligned) == "loop"
    with pytest.raises(ValueError, match="experts_impl='grouped_mm' cannot run here"):
        resolve_impl("grouped_mm", x, w_unaligned)
    x64 = torch.randn(4, 16, dtype=torch.float64)
    assert resolve_impl("auto", x64, torch.randn(2, 16, 8, dtype=torch.float64)) == "loop"
    assert resolve_impl("auto", torch.randn(4, 16), torch.randn(2, 16, 8)) == "grouped_mm"


def test_block_with_unaligned_expert_size_uses_fallback_and_stays_correct() -> None:
    cfg = MoEConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=6)
    block = MoEBlock(10, cfg)
    block.init_weights(torch.Generator().manual_seed(0))
    x = torch.randn(7, 10)
    assert block.experts.impl_for(x) == "loop"
    y, _ = block(x)
    loop_cfg = cfg.model_copy(update={"experts_impl": "loop"})
    twin = MoEBlock(10, loop_cfg)
    twin.load_state_dict(block.state_dict())
    assert torch.equal(y, twin(x)[0])


@pytest.mark.slow
def test_under_torch_compile_fp32_and_bf16() -> None:
    """Under torch.compile torch's kernel accepts bf16 only; fp32 goes through the opaque custom op."""
    x, w, offsets, counts = _case(torch.float32)

    def raw(a: torch.Tensor, b: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return F.grouped_mm(a, b, offs=o)

    with pytest.raises(Exception, match="BF16"):
        torch.compile(raw, backend="aot_eager", fullgraph=True)(x, w, offsets)

    def ours(a: torch.Tensor, b: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return grouped_mm(a, b, o).square().sum()

    compiled = torch.compile(ours, fullgraph=True)
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 1e-1)):
        xa, wa = x.to(dtype).clone().requires_grad_(True), w.to(dtype).clone().requires_grad_(True)
        compiled(xa, wa, offsets).backward()
        xb, wb = x.to(dtype).clone().requires_grad_(True), w.to(dtype).clone().requires_grad_(True)
        _reference(xb, wb, counts).square().sum().backward()
        assert xa.grad is not None and xb.grad is not None and wa.grad is not None and wb.grad is not None
        assert torch.allclose(xa.grad.float(), xb.grad.float(), atol=tol, rtol=tol), dtype
        assert torch.allclose(wa.grad.float(), wb.grad.float(), atol=tol, rtol=tol), dtype
