"""Causal attention inside each document with a sliding window and/or attention sinks (GPT-OSS).

Shape legend: T tokens of the packed row, H query heads, K key/value heads (G = H / K queries per key head),
L tokens of one document, d query-key head dimension, v value head dimension.

A sink is one learned logit per head that joins the softmax of every query as if it were one more key, and whose
value is zero: it takes probability mass away from the real keys. SDPA has neither a sink argument nor a way to
return the log-sum-exp that would let the sink be applied afterwards (``out · sigmoid(lse − sink)``), so this path
computes the attention explicitly, document by document: scores ``q kᵀ · scale``, the causal (and window) mask,
the sink column appended, a softmax in fp32, the sink column dropped, then ``p · v``; the same steps as
transformers' eager GPT-OSS attention, whose parity tests it passes at fp32 precision. Cost and memory are
Σ L² per head (the scores of one document at a time), as for the SDPA path; the window is applied as a mask, so a
window shorter than the document saves no arithmetic (a known limit of this CPU/fp32 path, see docs).

A window of W keeps the W most recent keys of a query, itself included (``i − j < W``, transformers' convention).

Under ``torch.compile`` the loop over documents runs inside the custom op ``xtrain::masked_attention_per_document``
(as :mod:`xtrain.model.document_sdpa` does for SDPA): its shape does not depend on the documents, so new lengths
and counts of documents compile nothing new.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from xtrain.model.document_sdpa import _host_lengths
from xtrain.model.documents import PackedDocuments

NO_WINDOW = -1
"""The window argument of the custom op for full causal attention."""


def masked_attention_per_document(  # noqa: PLR0917 (the attention arguments plus the two extras)
    q_THd: Tensor,
    k_TKd: Tensor,
    v_TKv: Tensor,
    docs: PackedDocuments,
    scale: float,
    window: int | None,
    sinks_H: Tensor | None,
) -> Tensor:
    """Per-document causal attention with an optional sliding ``window`` and per-head ``sinks_H`` logits."""
    window_arg = NO_WINDOW if window is None else window
    if torch.compiler.is_compiling():
        out: Tensor = torch.ops.xtrain.masked_attention_per_document(
            q_THd, k_TKd, v_TKv, docs.position_ids, scale, window_arg, sinks_H
        )
        return out
    return _attend_documents(q_THd, k_TKd, v_TKv, list(docs.lengths), scale, window_arg, sinks_H)


def _attend_one(  # noqa: PLR0917 (the attention arguments plus the two extras)
    q_LHd: Tensor, k_LKd: Tensor, v_LKv: Tensor, scale: float, window: int, sinks_H: Tensor | None
) -> Tensor:
    length, heads, _ = q_LHd.shape
    kv_heads = k_LKd.shape[1]
    groups = heads // kv_heads
    # Query heads h = kv_head * G + g share key head kv_head (transformers' repeat_kv order), without copying k/v.
    q_KGLd = q_LHd.view(length, kv_heads, groups, -1).permute(1, 2, 0, 3)
    k_K1dL = k_LKd.permute(1, 2, 0).unsqueeze(1)
    v_K1Lv = v_LKv.permute(1, 0, 2).unsqueeze(1)
    # The softmax runs in fp32 at least (bf16/fp16 inputs), in the input precision above that.
    softmax_dtype = torch.promote_types(q_LHd.dtype, torch.float32)
    scores_KGLL = torch.matmul(q_KGLd, k_K1dL).to(softmax_dtype) * scale
    i = torch.arange(length, device=q_LHd.device)
    offset_LL = i[:, None] - i[None, :]
    allowed_LL = offset_LL >= 0
    if window != NO_WINDOW:
        allowed_LL = allowed_LL & (offset_LL < window)
    scores_KGLL = scores_KGLL.masked_fill(~allowed_LL, float("-inf"))
    if sinks_H is not None:
        sink_KGL1 = sinks_H.to(softmax_dtype).view(kv_heads, groups, 1, 1).expand(kv_heads, groups, length, 1)
        probs_KGLL = torch.softmax(torch.cat((scores_KGLL, sink_KGL1), dim=-1), dim=-1)[..., :-1]
    else:
        probs_KGLL = torch.softmax(scores_KGLL, dim=-1)
    out_KGLv = torch.matmul(probs_KGLL.to(v_LKv.dtype), v_K1Lv)
    return out_KGLv.permute(2, 0, 1, 3).reshape(length, heads, -1)


def _attend_documents(  # noqa: PLR0917 (mirrors the custom op's positional schema)
    q_THd: Tensor,
    k_TKd: Tensor,
    v_TKv: Tensor,
    lengths: list[int],
    scale: float,
    window: int,
    sinks_H: Tensor | None,
) -> Tensor:
    outputs = [
        _attend_one(q, k, v, scale, window, sinks_H)
        for q, k, v in zip(
            torch.split(q_THd, lengths), torch.split(k_TKd, lengths), torch.split(v_TKv, lengths), strict=True
        )
    ]
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=0)


@torch.library.custom_op("xtrain::masked_attention_per_document", mutates_args=())
def _masked_op(  # noqa: PLR0917 (a custom op's arguments are positional in its schema)
    q_THd: Tensor,
    k_TKd: Tensor,
    v_TKv: Tensor,
    position_ids_T: Tensor,
    scale: float,
    window: int,
    sinks_H: Tensor | None,
) -> Tensor:
    lengths = _host_lengths(position_ids_T)
    return _attend_documents(q_THd, k_TKd, v_TKv, lengths, scale, window, sinks_H).contiguous()


@_masked_op.register_fake
def _(  # noqa: PLR0917 (the fake mirrors the op's signature)
    q_THd: Tensor,
    k_TKd: Tensor,
    v_TKv: Tensor,
    position_ids_T: Tensor,
    scale: float,
    window: int,
    sinks_H: Tensor | None,
) -> Tensor:
    return q_THd.new_empty(q_THd.shape[0], q_THd.shape[1], v_TKv.shape[-1])


@torch.library.custom_op("xtrain::masked_attention_per_document_backward", mutates_args=())
def _masked_backward_op(  # noqa: PLR0917 (a custom op's arguments are positional in its schema)
    grad_THv: Tensor,
    q_THd: Tensor,
    k_TKd: Tensor,
    v_TKv: Tensor,
    position_ids_T: Tensor,
    scale: float,
    window: int,
    sinks_H: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    # Recomputes the forward to differentiate it (the op saves q, k, v only, not the L×L probabilities).
    # Without sinks the caller passes an empty tensor, and its gradient comes back empty.
    lengths = _host_lengths(position_ids_T)
    if sinks_H.numel() == 0:
        vjp_fn = torch.func.vjp(
            lambda q, k, v: _attend_documents(q, k, v, lengths, scale, window, None), q_THd, k_TKd, v_TKv
        )[1]
        grad_q, grad_k, grad_v = vjp_fn(grad_THv.contiguous())
        grad_sinks = torch.empty_like(sinks_H)
    else:
        vjp_fn = torch.func.vjp(
            lambda q, k, v, s: _attend_documents(q, k, v, lengths, scale, window, s), q_THd, k_TKd, v_TKv, sinks_H
        )[1]
        grad_q, grad_k, grad_v, grad_sinks = vjp_fn(grad_THv.contiguous())
    return grad_q.contiguous(), grad_k.contiguous(), grad_v.contiguous(), grad_sinks.contiguous()


@_masked_backward_op.register_fake
def _(  # noqa: PLR0917 (the fake mirrors the op's signature)
    grad_THv: Tensor,
    q_THd: Tensor,
    k_TKd: Tensor,
    v_TKv: Tensor,
    position_ids_T: Tensor,
    scale: float,
    window: int,
    sinks_H: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return (
        q_THd.new_empty(q_THd.shape),
        k_TKd.new_empty(k_TKd.shape),
        v_TKv.new_empty(v_TKv.shape),
        sinks_H.new_empty(sinks_H.shape),
    )


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    q_THd, k_TKd, v_TKv, position_ids_T, scale, window, sinks_H = inputs
    has_sinks = sinks_H is not None
    sinks = sinks_H if has_sinks else q_THd.new_empty(0)
    ctx.save_for_backward(q_THd, k_TKd, v_TKv, position_ids_T, sinks)
    ctx.scale, ctx.window, ctx.has_sinks = scale, window, has_sinks


def _backward(ctx: Any, grad_THv: Tensor) -> tuple[Tensor | None, ...]:
    q_THd, k_TKd, v_TKv, position_ids_T, sinks = ctx.saved_tensors
    grads = torch.ops.xtrain.masked_attention_per_document_backward(
        grad_THv, q_THd, k_TKd, v_TKv, position_ids_T, ctx.scale, ctx.window, sinks
    )
    return grads[0], grads[1], grads[2], None, None, None, grads[3] if ctx.has_sinks else None


_masked_op.register_autograd(_backward, setup_context=_setup_context)
