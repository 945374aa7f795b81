"""Causal SDPA inside each document of a packed row: the portable attention path (CPU, and fp32 anywhere).

Shape legend: T tokens of the packed row, H query heads, K key/value heads (H is a multiple of K), L tokens of
one document, d head dimension.

Each document is one SDPA call on its own slice, so cost and memory grow with sum(L^2), not T^2, and the result
is exactly what each document would get alone. The loop runs over the documents' lengths as Python ints, which
``torch.compile`` would bake into the graph (one recompilation per new set of lengths). Under compile the loop
therefore runs inside ``xtrain::sdpa_per_document``, a custom op that dynamo and inductor treat as opaque: it takes
the boundaries as a tensor and reads them on the host when it runs (cheap on the CPU, one sync on an accelerator),
and calls the same SDPA kernels as the eager loop, so compiled and eager results are identical. That tensor is
``position_ids`` (a document starts where its positions restart at 0) rather than ``cu_seqlens``: its shape is the
row length whatever the number of documents, so a new count of documents compiles nothing new either.

A block-diagonal mask over the whole row would compile once too, but costs T^2 per head instead of sum(L^2);
FlexAttention has no CPU backward, and torch's varlen attention no CPU kernel.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from xtrain.model.documents import PackedDocuments


def sdpa_per_document(q_THd: Tensor, k_TKd: Tensor, v_TKd: Tensor, docs: PackedDocuments, scale: float) -> Tensor:
    """Causal SDPA on each document's slice of the row (an :data:`AttentionFunction`)."""
    if torch.compiler.is_compiling():
        out: Tensor = torch.ops.xtrain.sdpa_per_document(q_THd, k_TKd, v_TKd, docs.position_ids, scale)
        return out
    return _attend_documents(q_THd, k_TKd, v_TKd, list(docs.lengths), scale)


def _attend_documents(q_THd: Tensor, k_TKd: Tensor, v_TKd: Tensor, lengths: list[int], scale: float) -> Tensor:
    enable_gqa = q_THd.shape[1] != k_TKd.shape[1]
    outputs = []
    # split rather than one slice per document: its backward writes all documents' gradients into one tensor,
    # where N slices would each scatter into a zeroed [T, H, d] tensor that autograd then sums.
    for q_LHd, k_LKd, v_LKd in zip(
        torch.split(q_THd, lengths), torch.split(k_TKd, lengths), torch.split(v_TKd, lengths), strict=True
    ):
        # SDPA wants [batch, heads, L, d]; one document is a batch of one.
        out_1HLd = F.scaled_dot_product_attention(
            q_LHd.transpose(0, 1).unsqueeze(0),
            k_LKd.transpose(0, 1).unsqueeze(0),
            v_LKd.transpose(0, 1).unsqueeze(0),
            is_causal=True,
            scale=scale,
            enable_gqa=enable_gqa,
        )
        outputs.append(out_1HLd.squeeze(0).transpose(0, 1))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=0)


def _host_lengths(position_ids_T: Tensor) -> list[int]:
    starts = torch.nonzero(position_ids_T == 0).flatten().tolist()
    return [end - start for start, end in itertools.pairwise([*starts, position_ids_T.shape[0]])]


@torch.library.custom_op("xtrain::sdpa_per_document", mutates_args=())
def _sdpa_op(q_THd: Tensor, k_TKd: Tensor, v_TKd: Tensor, position_ids_T: Tensor, scale: float) -> Tensor:
    # Contiguous, as the fake below promises: a single document's output is a transposed view.
    return _attend_documents(q_THd, k_TKd, v_TKd, _host_lengths(position_ids_T), scale).contiguous()


@_sdpa_op.register_fake
def _(q_THd: Tensor, k_TKd: Tensor, v_TKd: Tensor, position_ids_T: Tensor, scale: float) -> Tensor:
    return q_THd.new_empty(q_THd.shape[0], q_THd.shape[1], v_TKd.shape[-1])


@torch.library.custom_op("xtrain::sdpa_per_document_backward", mutates_args=())
def _sdpa_backward_op(  # noqa: PLR0917 (a custom op's arguments are positional in its schema)
    grad_THd: Tensor, q_THd: Tensor, k_TKd: Tensor, v_TKd: Tensor, position_ids_T: Tensor, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    # Recomputes the forward to differentiate it: F.scaled_dot_product_attention does not return the log-sum-exp
    # its backward kernel needs, so the op saves q, k and v only (one attention forward more per backward, and
    # two [T, H, d] tensors fewer kept). torch.func.vjp, because autograd is switched off inside an op's kernel.
    lengths = _host_lengths(position_ids_T)
    vjp_fn = torch.func.vjp(lambda q, k, v: _attend_documents(q, k, v, lengths, scale), q_THd, k_TKd, v_TKd)[1]
    grad_q, grad_k, grad_v = vjp_fn(grad_THd.contiguous())
    return grad_q.contiguous(), grad_k.contiguous(), grad_v.contiguous()


@_sdpa_backward_op.register_fake
def _(  # noqa: PLR0917 (the fake mirrors the op's signature)
    grad_THd: Tensor, q_THd: Tensor, k_TKd: Tensor, v_TKd: Tensor, position_ids_T: Tensor, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    return q_THd.new_empty(q_THd.shape), k_TKd.new_empty(k_TKd.shape), v_TKd.new_empty(v_TKd.shape)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    q_THd, k_TKd, v_TKd, position_ids_T, scale = inputs
    ctx.save_for_backward(q_THd, k_TKd, v_TKd, position_ids_T)
    ctx.scale = scale


def _backward(ctx: Any, grad_THd: Tensor) -> tuple[Tensor | None, ...]:
    q_THd, k_TKd, v_TKd, position_ids_T = ctx.saved_tensors
    grads = torch.ops.xtrain.sdpa_per_document_backward(grad_THd, q_THd, k_TKd, v_TKd, position_ids_T, ctx.scale)
    return grads[0], grads[1], grads[2], None, None


_sdpa_op.register_autograd(_backward, setup_context=_setup_context)
