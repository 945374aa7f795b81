"""Grouped matrix multiplication over expert-sorted rows, with torch's kernel where it works and a fallback.

Legend: M rows (token-expert slots sorted by expert), K input features, N output features, G groups (experts).
`offsets` holds the cumulative row count of each group (int32), as torch's grouped_mm expects.

Two catches of torch's CPU kernel are handled here (see docs/engine-moe.md):
- its backward rejects an incoming gradient with stride 0 (what `out.sum().backward()` produces): the output
  passes through `_ContiguousGrad`, whose backward hands grouped_mm a dense gradient;
- under `torch.compile` its meta function accepts bf16 only: other dtypes go through `xtrain::grouped_mm`, a
  custom op that dynamo treats as opaque and that runs the same eager kernel.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F

_torch_grouped_mm: Any = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)

GroupedImpl = Literal["grouped_mm", "loop"]


def has_torch_grouped_mm() -> bool:
    """Whether the running torch has a grouped matmul (`F.grouped_mm` or `torch._grouped_mm`)."""
    return _torch_grouped_mm is not None


def grouped_mm_supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether torch's grouped matmul can compute `x @ w` on this device, dtype and shape."""
    if _torch_grouped_mm is None or x.dtype != w.dtype:
        return False
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    # The kernel requires 16-byte aligned row strides for every operand, gradients included.
    elem = x.element_size()
    if (w.shape[-2] * elem) % 16 or (w.shape[-1] * elem) % 16:
        return False
    if x.device.type == "cuda":
        return x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device) >= (8, 0)
    return x.device.type == "cpu"


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient dense (torch's grouped_mm backward rejects stride 0)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


@torch.library.custom_op("xtrain::grouped_mm", mutates_args=())
def _opaque_grouped_mm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = _torch_grouped_mm(x, w, offs=offsets)
    return out


@_opaque_grouped_mm.register_fake
def _(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], w.shape[-1])


@torch.library.custom_op("xtrain::grouped_mm_weight_grad", mutates_args=())
def _opaque_weight_grad(x: torch.Tensor, grad: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    # 2-D × 2-D grouped form: one [K, N] product per group of rows; empty groups give zeros.
    out: torch.Tensor = _torch_grouped_mm(x.t(), grad, offs=offsets)
    return out


@_opaque_weight_grad.register_fake
def _(x: torch.Tensor, grad: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return x.new_empty(offsets.shape[0], x.shape[1], grad.shape[1])


def _opaque_setup_context(ctx: Any, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
    x, w, offsets = inputs
    ctx.save_for_backward(x, w, offsets)


def _opaque_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    x, w, offsets = ctx.saved_tensors
    grad = grad.contiguous()
    grad_x = _opaque_grouped_mm(grad, w.transpose(-2, -1), offsets) if ctx.needs_input_grad[0] else None
    grad_w = _opaque_weight_grad(x, grad, offsets) if ctx.needs_input_grad[1] else None
    return grad_x, grad_w, None


_opaque_grouped_mm.register_autograd(_opaque_backward, setup_context=_opaque_setup_context)


def _loop_grouped_mm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Portable fallback: one matmul per non-empty group (reads the offsets on the host)."""
    counts = torch.diff(offsets.long(), prepend=offsets.new_zeros(1).long()).tolist()
    outs = [chunk @ w[g] for g, chunk in enumerate(torch.split(x, counts, dim=0)) if chunk.shape[0] > 0]
    if not outs:  # no rows at all: an empty product keeps the result attached to the graph
        return x @ w[0]
    return torch.cat(outs, dim=0)


def resolve_impl(requested: str, x: torch.Tensor, w: torch.Tensor) -> GroupedImpl:
    """The implementation `grouped_mm` will use for a requested `MoEConfig.experts_impl`."""
    if requested == "loop":
        return "loop"
    if grouped_mm_supported(x, w):
        return "grouped_mm"
    if requested == "grouped_mm":
        raise ValueError(
            f"experts_impl='grouped_mm' cannot run here (device={x.device.type}, dtype={x.dtype}, "
            f"K={w.shape[-2]}, N={w.shape[-1]}, torch has grouped_mm: {has_torch_grouped_mm()}): "
            "use experts_impl='auto' or 'loop'"
        )
    return "loop"


def grouped_mm(
    x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, impl: GroupedImpl = "grouped_mm"
) -> torch.Tensor:
    """`out[rows of group g] = x[rows of group g] @ w[g]` for rows sorted by group; rows past the last offset
    are not allowed (callers pass offsets ending at M)."""
    if impl == "loop":
        return _loop_grouped_mm(x, w, offsets)
    if torch.compiler.is_compiling() and x.dtype != torch.bfloat16:
        out: torch.Tensor = _opaque_grouped_mm(x, w, offsets)
        return out
    result: torch.Tensor = _ContiguousGrad.apply(_torch_grouped_mm(x, w, offs=offsets))  # type: ignore[no-untyped-call]  # torch leaves Function.apply untyped
    return result
