"""Moving token rows to and from expert order, and the routing-weighted SwiGLU between the two grouped matmuls.

Legend: T tokens, D hidden size, K experts per token, F expert hidden size, S = T*K token-expert slots in
expert order. `token_S[s]` is the token of sorted slot s; `slot_rank_S[t*K + j]` is where token t's j-th slot
sits in expert order.

Each autograd function here allocates one output and saves only what its backward needs: on the CPU a fresh
S×D buffer costs as much in page faults as the arithmetic on it, so fewer and smaller temporaries are most of
what makes the block faster than a composition of standard ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

# Rows per piece when the CPU works through S-row tensors piecewise: temporaries of a few MiB stay in the
# allocator's heap and in cache, instead of being mapped, faulted in and unmapped at every call.
_CPU_PIECE_ROWS = 4096


def _pieces(rows: int, device: torch.device, piece_rows: int = _CPU_PIECE_ROWS) -> list[tuple[int, int]]:
    # Under torch.compile one piece: inductor fuses the elementwise work without temporaries anyway, and a
    # Python loop over pieces would only unroll into a larger graph.
    piecewise = device.type == "cpu" and not torch.compiler.is_compiling()
    step = piece_rows if piecewise else max(rows, 1)
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


def _mul_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """out = a * b, written in place; `out` may be a column slice (not contiguous)."""
    if torch.compiler.is_compiling():
        # Dynamo refuses an `out=` that is not contiguous (a graph break); a copy into the view is the same
        # values, and inductor fuses the product and the copy into one kernel.
        out.copy_(a * b)
    else:
        # Eager: the product is written straight into the slice, with no temporary.
        torch.mul(a, b, out=out)


@torch.no_grad()
def sort_slots(routed_experts_TK: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One stable sort of the T*K token-expert slots by expert, which every later step reuses: ``order_S`` (the
    slot at each sorted position) and ``token_S`` (its token)."""
    order_S = torch.argsort(routed_experts_TK.reshape(-1), stable=True)
    return order_S, torch.div(order_S, routed_experts_TK.shape[1], rounding_mode="floor")


@dataclass(frozen=True)
class SlotLayout:
    """Where the T*K token-expert slots of one batch go in expert order, and the way back: what dispatch and
    combine need (built once by :func:`permute_slots`, on the device, no host synchronisation)."""

    token_S: torch.Tensor  # noqa: N815 (shape suffix, see the legend)
    """Token of each sorted slot."""
    slot_rank_S: torch.Tensor  # noqa: N815 (shape suffix, see the legend)
    """Sorted position of slot t*K + j (the inverse permutation)."""
    k: int
    """Experts per token."""
    num_tokens: int
    """Tokens T of the batch."""


def permute_slots(routed_experts_TK: torch.Tensor, routing_weights_TK: torch.Tensor) -> tuple[SlotLayout, torch.Tensor]:
    """The layout of the slots sorted by expert (stable: ties keep token order) and the routing weight of each
    sorted slot, weight_S1 [S, 1] (with grad)."""
    order_S, token_S = sort_slots(routed_experts_TK)
    slot_rank_S = torch.empty_like(order_S)
    slot_rank_S[order_S] = torch.arange(order_S.numel(), device=order_S.device)
    weight_S1 = routing_weights_TK.reshape(-1)[order_S].unsqueeze(-1)
    layout = SlotLayout(token_S, slot_rank_S, routed_experts_TK.shape[1], routed_experts_TK.shape[0])
    return layout, weight_S1


def dispatch_rows(x_TD: torch.Tensor, layout: SlotLayout) -> torch.Tensor:
    """Token rows in expert order, x_SD = x_TD[token_S] (differentiable)."""
    rows: torch.Tensor = DispatchRows.apply(x_TD, layout.token_S, layout.slot_rank_S, layout.k)  # type: ignore[no-untyped-call]  # Function.apply is untyped
    return rows


def combine_rows(out_SD: torch.Tensor, layout: SlotLayout) -> torch.Tensor:
    """Rows in expert order summed back per token over its K slots, y_TD (differentiable)."""
    y: torch.Tensor = CombineRows.apply(out_SD, layout.token_S, layout.slot_rank_S, layout.k)  # type: ignore[no-untyped-call]  # Function.apply is untyped
    return y


def group_offsets(tokens_per_expert_E: torch.Tensor) -> torch.Tensor:
    """The grouped matmul's offsets: int32 end of each expert's rows."""
    return torch.cumsum(tokens_per_expert_E, dim=0).to(torch.int32)


def sum_slots(
    rows_SD: torch.Tensor, token_S: torch.Tensor, slot_rank_S: torch.Tensor, k: int, num_tokens: int
) -> torch.Tensor:
    """Rows in expert order → per-token sum over its K slots, [T, D]."""
    if rows_SD.device.type == "cpu" and rows_SD.dtype in (torch.float32, torch.float64):
        # One pass with no S×D temporary; on the CPU index_add_ is deterministic.
        out_TD = rows_SD.new_zeros(num_tokens, rows_SD.shape[-1])
        return out_TD.index_add_(0, token_S, rows_SD)
    # Elsewhere a gather then a reduction: deterministic on accelerators (no atomics), and the reduction
    # accumulates bf16/fp16 in fp32 instead of rounding after each of the K additions. Piecewise over tokens
    # so the gathered temporary stays small.
    out_TD = rows_SD.new_empty(num_tokens, rows_SD.shape[-1])
    for start, stop in _pieces(num_tokens, rows_SD.device, _CPU_PIECE_ROWS // k):
        gathered = rows_SD.index_select(0, slot_rank_S[start * k : stop * k])
        torch.sum(gathered.view(stop - start, k, -1), dim=1, out=out_TD[start:stop])
    return out_TD


class DispatchRows(torch.autograd.Function):
    """x_SD = x_TD[token_S]; backward: the per-token sum of the K slot gradients."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, token: torch.Tensor, slot_rank: torch.Tensor, k: int) -> Any:
        ctx.save_for_backward(token, slot_rank)
        ctx.k = k
        ctx.num_tokens = x.shape[0]
        return x.index_select(0, token)

    @staticmethod
    def backward(ctx: Any, grad_SD: torch.Tensor) -> Any:
        token_S, slot_rank_S = ctx.saved_tensors
        return sum_slots(grad_SD, token_S, slot_rank_S, ctx.k, ctx.num_tokens), None, None, None


class CombineRows(torch.autograd.Function):
    """y_TD = per-token sum of its K rows of out_SD; backward: grad_SD = grad_TD[token_S] (the adjoint)."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, token: torch.Tensor, slot_rank: torch.Tensor, k: int) -> Any:
        ctx.save_for_backward(token)
        return sum_slots(rows, token, slot_rank, k, rows.shape[0] // k)

    @staticmethod
    def backward(ctx: Any, grad_TD: torch.Tensor) -> Any:
        (token_S,) = ctx.saved_tensors
        return grad_TD.index_select(0, token_S), None, None, None


class WeightedSwiGLU(torch.autograd.Function):
    """h_SF = silu(gate_SF) * up_SF * weight_S1 from gate_up_S2F = [gate | up].

    Forward writes one output buffer; backward writes the gate and up gradients into one [S, 2F] buffer, the
    layout the grouped matmul's backward consumes, and saves only gate_up and the weights (autograd's
    composition would save three more S×F tensors). On the CPU both work piecewise over rows.
    """

    @staticmethod
    def forward(ctx: Any, gate_up: torch.Tensor, weight: torch.Tensor) -> Any:
        f = gate_up.shape[-1] // 2
        h_SF = gate_up.new_empty(gate_up.shape[0], f)
        for a, b in _pieces(gate_up.shape[0], gate_up.device):
            torch.mul(F.silu(gate_up[a:b, :f]), gate_up[a:b, f:], out=h_SF[a:b]).mul_(weight[a:b])
        ctx.save_for_backward(gate_up, weight)
        return h_SF

    @staticmethod
    def backward(ctx: Any, grad_h: torch.Tensor) -> Any:
        gate_up_S2F, weight_S1 = ctx.saved_tensors
        f = gate_up_S2F.shape[-1] // 2
        grad_h = grad_h.contiguous()
        grad_gate_up_S2F = torch.empty_like(gate_up_S2F)
        want_weight = ctx.needs_input_grad[1]
        grad_weight_S1 = torch.empty_like(weight_S1) if want_weight else None
        for a, b in _pieces(gate_up_S2F.shape[0], gate_up_S2F.device):
            gate, up, grad = gate_up_S2F[a:b, :f], gate_up_S2F[a:b, f:], grad_h[a:b]
            sig = torch.sigmoid(gate)
            silu = gate * sig
            grad_weighted = grad * weight_S1[a:b]
            _mul_into(grad_gate_up_S2F[a:b, f:], grad_weighted, silu)
            # d silu(g)/dg = sig * (1 + g * (1 - sig)), built in place in one buffer.
            dsilu = torch.rsub(sig, 1.0).mul_(gate).add_(1.0).mul_(sig)
            _mul_into(grad_gate_up_S2F[a:b, :f], dsilu.mul_(up), grad_weighted)
            if grad_weight_S1 is not None:
                torch.sum(silu.mul_(up).mul_(grad), dim=-1, keepdim=True, out=grad_weight_S1[a:b])
        return grad_gate_up_S2F, grad_weight_S1
