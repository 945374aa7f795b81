"""Cross-entropy over the output projection, chunk by chunk along the tokens, gradients computed in the forward.

Shape legend: T tokens, D hidden size, V vocabulary size, C tokens of one chunk.

Why this shape of computation: at V=151,936 the full [T, V] logits of a 4k-token pack are 2.5 GB in fp32, and
autograd's cross-entropy holds two to three tensors of that size at its peak. Here the output projection and
the cross-entropy run C tokens at a time into one reused [C, V] buffer. Because the loss is the last thing the
forward computes and its gradient with respect to the logits needs nothing from later (softmax minus one-hot,
scaled by 1/normaliser), each chunk's gradients for the hidden states and for the output weight are produced
right there in the forward, while the chunk's logits are at hand. Backward then only multiplies the stored
gradients by grad_output: nothing is recomputed, and the output weight is not needed after the forward (FSDP2
may reshard it at once).

Precision: the logits come from the matmul in the input dtype; the log-softmax and the logits' gradient are
fp32. For 16-bit inputs the hidden-state gradient is the fp32 logits' gradient cast to the input dtype times
the weight (a 16-bit matmul, as autograd would do), and the weight gradient is accumulated in fp32 over the
chunks (fp32 matmul of the fp32 logits' gradient with the upcast chunk of hidden states), returned in the
weight's dtype.
"""

from typing import Any

import torch
from torch import Tensor

from xtrain.loss.chunk_size import SUPPORTED_DTYPES


def chunked_cross_entropy(
    hidden_TD: Tensor,
    weight_VD: Tensor,
    labels_T: Tensor,
    *,
    normaliser: float | Tensor,
    chunk_tokens: int,
    ignore_index: int = -100,
) -> Tensor:
    """Sum over tokens of CE(hidden @ weight.T, labels), divided by `normaliser`: an fp32 scalar.

    `normaliser` is the global number of target tokens (over all micro-batches and data-parallel ranks), so
    that the gradients of every micro-batch on every rank add up to those of the mean over the global batch.
    It must be positive; a tensor normaliser is not checked (that would synchronise with the device), and a
    zero one gives NaN. The unnormalised sum, for logging, is ``loss.detach() * normaliser``: no extra work.

    Tokens whose label is `ignore_index` contribute nothing (neither loss nor gradient). A label outside
    [0, V) that is not `ignore_index` is an index error, as in torch's cross-entropy.

    `weight_VD` may be an ``nn.Parameter``, the plain unsharded tensor FSDP2 hands to the forward, or a tied
    embedding matrix: its gradient flows through autograd like any other op's. `hidden_TD` and `weight_VD`
    must share a dtype (float32, bfloat16 or float16) and a device. When grad mode is off or neither input
    requires grad, only the loss is computed.

    The backward can run once: the gradients are computed in the forward and scaled in place by the backward.
    """
    _check_inputs(hidden_TD, weight_VD, labels_T, normaliser=normaliser, chunk_tokens=chunk_tokens)
    if torch.is_grad_enabled() and (hidden_TD.requires_grad or weight_VD.requires_grad):
        loss: Tensor = _ChunkedCrossEntropy.apply(  # type: ignore[no-untyped-call]  # torch leaves apply untyped
            hidden_TD, weight_VD, labels_T, normaliser, chunk_tokens, ignore_index
        )
        return loss
    loss_sum, _, _ = _chunk_pass(
        hidden_TD,
        weight_VD,
        labels_T,
        chunk_tokens=chunk_tokens,
        ignore_index=ignore_index,
        grad_scale=None,
        want_hidden_grad=False,
        want_weight_grad=False,
    )
    return loss_sum / normaliser


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Forward computes the loss and (as needed) both input gradients; backward scales them by grad_output."""

    @staticmethod
    def forward(  # noqa: PLR0917 (autograd.Function.apply passes its arguments positionally)
        ctx: Any,
        hidden_TD: Tensor,
        weight_VD: Tensor,
        labels_T: Tensor,
        normaliser: float | Tensor,
        chunk_tokens: int,
        ignore_index: int,
    ) -> Tensor:
        loss_sum, grad_hidden_TD, grad_weight_VD = _chunk_pass(
            hidden_TD,
            weight_VD,
            labels_T,
            chunk_tokens=chunk_tokens,
            ignore_index=ignore_index,
            grad_scale=1.0 / normaliser,
            want_hidden_grad=ctx.needs_input_grad[0],
            want_weight_grad=ctx.needs_input_grad[1],
        )
        # Kept as attributes, not save_for_backward: they are results, not activations, so saved-tensor hooks
        # (activation offload) must not move them, and they are released as soon as backward has used them.
        ctx.grads = (grad_hidden_TD, grad_weight_VD)
        return loss_sum / normaliser

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor | None, ...]:
        if ctx.grads is None:
            raise RuntimeError(
                "chunked_cross_entropy: backward ran twice through the same forward; its gradients are computed "
                "once in the forward, so call the loss again instead of retain_graph=True"
            )
        grad_hidden_TD, grad_weight_VD = ctx.grads
        ctx.grads = None
        # In place: a scaled copy would double the memory held for the [V, D] weight gradient.
        for grad in (grad_hidden_TD, grad_weight_VD):
            if grad is not None:
                grad.mul_(grad_loss)
        return grad_hidden_TD, grad_weight_VD, None, None, None, None


def _chunk_pass(
    hidden_TD: Tensor,
    weight_VD: Tensor,
    labels_T: Tensor,
    *,
    chunk_tokens: int,
    ignore_index: int,
    grad_scale: float | Tensor | None,
    want_hidden_grad: bool,
    want_weight_grad: bool,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """One pass over the chunks: the fp32 loss sum, and the gradients of (sum / normaliser) when asked.

    `grad_scale` is 1/normaliser (needed only when a gradient is asked for).
    """
    tokens, vocab = hidden_TD.shape[0], weight_VD.shape[0]
    device, dtype = hidden_TD.device, hidden_TD.dtype
    want_grad = want_hidden_grad or want_weight_grad
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    # Every row of the hidden gradient is written by a chunk's matmul, so it needs no zeroing.
    grad_hidden_TD = torch.empty_like(hidden_TD) if want_hidden_grad else None
    grad_weight_acc_VD = torch.zeros(weight_VD.shape, dtype=torch.float32, device=device) if want_weight_grad else None
    rows = min(chunk_tokens, tokens)
    # Buffers reused by every chunk: a fresh [C, V] allocation per chunk would cost page faults (CPU) or
    # allocator churn, and at most these two [C, V] tensors exist at any time.
    logits_buf_CV = torch.empty((rows, vocab), dtype=dtype, device=device)
    fp32_buf_CV = logits_buf_CV if dtype == torch.float32 else torch.empty((rows, vocab), device=device)
    weight_DV = weight_VD.t()
    for start in range(0, tokens, chunk_tokens):
        stop = min(start + chunk_tokens, tokens)
        hidden_CD, labels_C = hidden_TD[start:stop], labels_T[start:stop]
        logits_CV = logits_buf_CV[: stop - start]
        torch.mm(hidden_CD, weight_DV, out=logits_CV)
        probs_CV = fp32_buf_CV[: stop - start]
        if probs_CV is not logits_CV:
            probs_CV.copy_(logits_CV)

        valid_C = labels_C != ignore_index
        target_C1 = torch.where(valid_C, labels_C, 0).unsqueeze(1)
        target_logit_C = probs_CV.gather(1, target_C1).squeeze(1)
        # Log-sum-exp in place (torch.logsumexp would allocate a [C, V] temporary): probs = exp(logits - max).
        max_C = probs_CV.amax(dim=1)
        probs_CV.sub_(max_C.unsqueeze(1)).exp_()
        sum_exp_C = probs_CV.sum(dim=1)
        token_loss_C = max_C + sum_exp_C.log() - target_logit_C
        loss_sum += torch.where(valid_C, token_loss_C, 0.0).sum()
        if not want_grad:
            continue

        assert grad_scale is not None
        # d(loss_sum * grad_scale)/d logits = (softmax - one_hot) * grad_scale, zero on ignored tokens.
        token_scale_C = valid_C.to(torch.float32) * grad_scale
        probs_CV.mul_((token_scale_C / sum_exp_C).unsqueeze(1))
        probs_CV.scatter_add_(1, target_C1, -token_scale_C.unsqueeze(1))
        grad_logits_CV = probs_CV
        if grad_hidden_TD is not None:
            grad_logits_in_dtype_CV = grad_logits_CV
            if dtype != torch.float32:
                grad_logits_in_dtype_CV = logits_CV.copy_(grad_logits_CV)  # the 16-bit buffer is free again
            torch.mm(grad_logits_in_dtype_CV, weight_VD, out=grad_hidden_TD[start:stop])
        if grad_weight_acc_VD is not None:
            grad_weight_acc_VD.addmm_(grad_logits_CV.t(), hidden_CD.float())

    grad_weight_VD = None
    if grad_weight_acc_VD is not None:
        grad_weight_VD = grad_weight_acc_VD.to(weight_VD.dtype)
    return loss_sum, grad_hidden_TD, grad_weight_VD


def _check_inputs(
    hidden_TD: Tensor,
    weight_VD: Tensor,
    labels_T: Tensor,
    *,
    normaliser: float | Tensor,
    chunk_tokens: int,
) -> None:
    """One clear ValueError per kind of misuse, before any work."""
    if hidden_TD.dim() != 2 or weight_VD.dim() != 2:
        raise ValueError(
            "chunked loss: hidden must be [T, D] and weight [V, D]; "
            f"got hidden {tuple(hidden_TD.shape)} and weight {tuple(weight_VD.shape)}"
        )
    if hidden_TD.shape[1] != weight_VD.shape[1]:
        raise ValueError(
            f"chunked loss: hidden size differs: hidden {tuple(hidden_TD.shape)}, weight {tuple(weight_VD.shape)}"
        )
    if labels_T.shape != (hidden_TD.shape[0],):
        raise ValueError(f"chunked loss: labels must be [T] = [{hidden_TD.shape[0]}], got {tuple(labels_T.shape)}")
    if labels_T.dtype.is_floating_point or labels_T.dtype == torch.bool:
        raise ValueError(f"chunked loss: labels must be an integer tensor, got {labels_T.dtype}")
    if hidden_TD.dtype != weight_VD.dtype or hidden_TD.dtype not in SUPPORTED_DTYPES:
        raise ValueError(
            "chunked loss: hidden and weight must share one of float32, bfloat16, float16; "
            f"got {hidden_TD.dtype} and {weight_VD.dtype}"
        )
    if not hidden_TD.device == weight_VD.device == labels_T.device:
        raise ValueError(
            f"chunked loss: inputs on different devices: hidden {hidden_TD.device}, weight {weight_VD.device}, "
            f"labels {labels_T.device}"
        )
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ValueError(f"chunked loss: chunk_tokens must be a positive integer, got {chunk_tokens!r}")
    if not isinstance(normaliser, Tensor) and not normaliser > 0:
        raise ValueError(f"chunked loss: normaliser must be positive (the number of target tokens), got {normaliser}")
