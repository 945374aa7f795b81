"""The routed experts on the CPU in eager mode: dispatch, gate/up, weighted SwiGLU, down and combine fused per expert.

Legend: T tokens, D hidden size, E experts, K experts per token, F expert hidden size, S = T*K token-expert slots
in expert order, n the rows of one expert.

torch's CPU grouped matmul is itself a loop of one matmul per group, so doing that loop here costs the same
matmuls and lets every other step work on one expert's rows while they are in cache: the token rows are
gathered into a small scratch buffer, the down projection's output is added straight into the per-token result,
and no S×D tensor (dispatched input, down output, its gradient, the dispatched input gradient) is ever
allocated. On the CPU a fresh S×D buffer (128 MiB in fp32 at 32k slots) costs about as much in page faults as
the arithmetic on it. Only the [S, 2F] gate/up output is saved for backward; the gathered input and the
activation are recomputed there from it and from the block input.

Numerics match the grouped path: the same per-expert matmuls (one per expert, never split, so weight gradients
are not accumulated in pieces), the SwiGLU in the input dtype, and the K slots of a token summed in fp32 for
bf16/fp16 (one rounding at the end), in expert order.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable


def _accumulator(num_tokens: int, like: torch.Tensor) -> torch.Tensor:
    """Zeroed [T, D] sum of the K slots: fp32 for reduced-precision inputs, which round once at the end."""
    dtype = torch.float32 if like.dtype in (torch.bfloat16, torch.float16) else like.dtype
    return torch.zeros(num_tokens, like.shape[-1], dtype=dtype, device=like.device)


def _add_rows(acc_TD: torch.Tensor, token_n: torch.Tensor, rows_nD: torch.Tensor) -> None:
    acc_TD.index_add_(0, token_n, rows_nD if rows_nD.dtype == acc_TD.dtype else rows_nD.to(acc_TD.dtype))


class FusedExpertsCPU(torch.autograd.Function):
    """y_TD = Σ over each token's K slots of down_e(silu(gate_e(x)) * up_e(x) * w), computed expert by expert.

    Inputs: x [T, D], weight_S1 (routing weights in expert order), gate_up_proj [E, 2F, D], down_proj [E, D, F],
    token_S (token of each sorted slot), counts (rows per expert, a Python list).
    """

    @staticmethod
    def forward(  # noqa: PLR0917 (autograd.Function.apply passes its arguments positionally)
        ctx: Any,
        x: torch.Tensor,
        weight_S1: torch.Tensor,
        gate_up_proj: torch.Tensor,
        down_proj: torch.Tensor,
        token_S: torch.Tensor,
        counts: list[int],
    ) -> Any:
        num_slots, f = token_S.shape[0], down_proj.shape[-1]
        gate_up_S2F = x.new_empty(num_slots, 2 * f)
        acc_TD = _accumulator(x.shape[0], x)
        widest = max(counts, default=0)
        x_nD = x.new_empty(widest, x.shape[1])
        h_nF = x.new_empty(widest, f)
        out_nD = x.new_empty(widest, x.shape[1])
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            stop = start + n
            token_n = token_S[start:stop]
            xs, h, out = x_nD[:n], h_nF[:n], out_nD[:n]
            torch.index_select(x, 0, token_n, out=xs)
            gate_up = torch.mm(xs, gate_up_proj[e].t(), out=gate_up_S2F[start:stop])
            torch.mul(F.silu(gate_up[:, :f]), gate_up[:, f:], out=h).mul_(weight_S1[start:stop])
            torch.mm(h, down_proj[e].t(), out=out)
            _add_rows(acc_TD, token_n, out)
            start = stop
        ctx.save_for_backward(x, weight_S1, gate_up_proj, down_proj, token_S, gate_up_S2F)
        ctx.counts = counts
        return acc_TD if acc_TD.dtype == x.dtype else acc_TD.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_y: torch.Tensor) -> Any:
        x, weight_S1, gate_up_proj, down_proj, token_S, gate_up_S2F = ctx.saved_tensors
        counts: list[int] = ctx.counts
        want_x, want_w, want_gu, want_down = ctx.needs_input_grad[:4]
        f = down_proj.shape[-1]
        grad_acc_TD = _accumulator(x.shape[0], x) if want_x else None
        grad_w_S1 = torch.empty_like(weight_S1) if want_w else None
        # Written expert by expert (matmul out=): only experts without rows need zeros.
        grad_gate_up_proj = torch.empty_like(gate_up_proj) if want_gu else None
        grad_down_proj = torch.empty_like(down_proj) if want_down else None
        widest = max(counts, default=0)
        gy_nD = grad_y.new_empty(widest, grad_y.shape[1])
        x_nD = x.new_empty(widest, x.shape[1])
        g_n2F = x.new_empty(widest, 2 * f)
        grad_xs_nD = x.new_empty(widest, x.shape[1])
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                for grad_proj in (grad_gate_up_proj, grad_down_proj):
                    if grad_proj is not None:
                        grad_proj[e].zero_()
                continue
            stop = start + n
            token_n, w = token_S[start:stop], weight_S1[start:stop]
            gate, up = gate_up_S2F[start:stop, :f], gate_up_S2F[start:stop, f:]
            gy = gy_nD[:n]
            torch.index_select(grad_y, 0, token_n, out=gy)
            sig = torch.sigmoid(gate)
            silu = gate * sig
            act = silu * up  # the activation before the routing weight
            if grad_down_proj is not None:
                # d down_e = gyᵀ @ h, with h recomputed exactly as forward made it (F.silu, then up, then w), so
                # the product is bit for bit the grouped path's (whose backward reads the saved h).
                torch.mm(gy.t(), torch.mul(F.silu(gate), up).mul_(w), out=grad_down_proj[e])
            grad_h = torch.mm(gy, down_proj[e])
            if grad_w_S1 is not None:
                torch.sum(act.mul_(grad_h), dim=-1, keepdim=True, out=grad_w_S1[start:stop])
            grad_h.mul_(w)
            g = g_n2F[:n]
            torch.mul(grad_h, silu, out=g[:, f:])
            # d silu(g)/dg = sig * (1 + g * (1 - sig)), built in place in one buffer.
            dsilu = torch.rsub(sig, 1.0).mul_(gate).add_(1.0).mul_(sig)
            torch.mul(dsilu.mul_(up), grad_h, out=g[:, :f])
            if grad_gate_up_proj is not None or grad_acc_TD is not None:
                xs = x_nD[:n]
                torch.index_select(x, 0, token_n, out=xs)
                if grad_gate_up_proj is not None:
                    torch.mm(g.t(), xs, out=grad_gate_up_proj[e])
                if grad_acc_TD is not None:
                    _add_rows(grad_acc_TD, token_n, torch.mm(g, gate_up_proj[e], out=grad_xs_nD[:n]))
            start = stop
        grad_x = None
        if grad_acc_TD is not None:
            grad_x = grad_acc_TD if grad_acc_TD.dtype == x.dtype else grad_acc_TD.to(x.dtype)
        return grad_x, grad_w_S1, grad_gate_up_proj, grad_down_proj, None, None
