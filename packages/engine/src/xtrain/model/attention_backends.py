"""Packed variable-length causal attention, and the choice of the kernel that computes it.

Shape legend: T tokens of the packed row, H query heads, K key/value heads (H is a multiple of K), d head dim.

Backends, in the order ``"auto"`` prefers them:

- ``flash_attn``: flash-attn's ``flash_attn_varlen_func`` (CUDA, fp16/bf16, when the package is installed).
- ``torch_varlen``: torch's own ``torch.nn.attention.varlen.varlen_attn`` (CUDA, fp16/bf16, torch >= 2.10;
  it has no CPU kernel).
- ``sdpa``: ``scaled_dot_product_attention`` once per document (:mod:`xtrain.model.document_sdpa`), on any
  device and dtype. The CPU path, and the fallback for fp32 on CUDA (the varlen kernels only take half precision).

Selection is a pure function of :class:`Capabilities`, so it is tested on a CPU machine with capabilities
injected; :func:`detect_capabilities` fills them in from the running process. A backend requested by name
that cannot run raises :class:`~xtrain.errors.AttentionBackendError` instead of silently falling back.
:func:`resolve_attention` memoises the whole choice per (requested, device type, dtype): the model asks for its
kernel at every forward, and the answer is computed on the first one only.
"""

import functools
import importlib
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from torch import Tensor

from xtrain.errors import AttentionBackendError
from xtrain.model.document_sdpa import sdpa_per_document
from xtrain.model.documents import PackedDocuments

AttentionBackendName = Literal["auto", "flash_attn", "torch_varlen", "sdpa"]
CONCRETE_BACKENDS: tuple[str, ...] = ("flash_attn", "torch_varlen", "sdpa")
_HALF_DTYPES = (torch.float16, torch.bfloat16)

AttentionFunction = Callable[[Tensor, Tensor, Tensor, PackedDocuments, float], Tensor]
"""(q_THd, k_TKd, v_TKd, documents, scale) -> out_THd, causal within each document."""


@dataclass(frozen=True)
class Capabilities:
    """What the running process can do, as far as attention kernels care."""

    device_type: str
    dtype: torch.dtype
    flash_attn_importable: bool
    torch_varlen_present: bool


def detect_capabilities(device: torch.device, dtype: torch.dtype) -> Capabilities:
    return Capabilities(
        device_type=device.type,
        dtype=dtype,
        flash_attn_importable=_flash_attn_importable(),
        torch_varlen_present=_torch_varlen_function() is not None,
    )


def unavailable_reason(backend: str, caps: Capabilities) -> str | None:
    """Why ``backend`` cannot run with these capabilities, or None when it can."""
    if backend == "sdpa":
        return None
    if caps.device_type != "cuda":
        return f"it needs a CUDA device, and the model is on {caps.device_type!r}"
    if caps.dtype not in _HALF_DTYPES:
        return f"it needs fp16 or bf16 activations, and the model computes in {caps.dtype}"
    if backend == "flash_attn" and not caps.flash_attn_importable:
        return "the flash_attn package is not installed (pip install 'xtrain[cuda]')"
    if backend == "torch_varlen" and not caps.torch_varlen_present:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn"
    return None


def select_attention_backend(requested: str, caps: Capabilities) -> str:
    """The concrete backend to use: the first available one for ``"auto"``, else the one requested."""
    if requested not in get_args(AttentionBackendName):
        raise AttentionBackendError(
            f"unknown attention backend {requested!r}; choose one of {', '.join(get_args(AttentionBackendName))}"
        )
    if requested == "auto":
        return next(name for name in CONCRETE_BACKENDS if unavailable_reason(name, caps) is None)
    reason = unavailable_reason(requested, caps)
    if reason is not None:
        usable = [name for name in CONCRETE_BACKENDS if unavailable_reason(name, caps) is None]
        raise AttentionBackendError(
            f"attention backend {requested!r} was requested but cannot run: {reason}. "
            f"Usable here: {', '.join(usable)} (or set attention_backend='auto')"
        )
    return requested


@functools.cache
def resolve_attention(requested: str, device_type: str, dtype: torch.dtype) -> AttentionFunction:
    """The kernel for ``requested`` on this device type and dtype, selected once per combination (a failed
    selection is not cached: it raises again on the next call)."""
    caps = detect_capabilities(torch.device(device_type), dtype)
    return attention_function(select_attention_backend(requested, caps))


def attention_function(backend: str) -> AttentionFunction:
    functions: dict[str, AttentionFunction] = {
        "flash_attn": _with_value_padding(_flash_attn_varlen),
        "torch_varlen": _with_value_padding(_torch_varlen),
        "sdpa": sdpa_per_document,
    }
    return functions[backend]


def _with_value_padding(kernel: AttentionFunction) -> AttentionFunction:
    """Let a varlen kernel take values narrower or wider than the query-key heads (multi-head latent attention).

    flash-attn 2's varlen kernel requires one head dimension for q, k and v; so values are zero-padded to the
    query-key width (or queries and keys to the value width when values are wider; zero columns add nothing to
    q·k) and the output is cut back to the value width: exact, at the cost of attention over the padded width.
    SDPA takes different widths as they are and needs none of this.
    """

    def padded(q_THd: Tensor, k_TKd: Tensor, v_TKv: Tensor, docs: PackedDocuments, scale: float) -> Tensor:
        d_qk, d_v = q_THd.shape[-1], v_TKv.shape[-1]
        if d_qk == d_v:
            return kernel(q_THd, k_TKd, v_TKv, docs, scale)
        width = max(d_qk, d_v)
        q_THd, k_TKd = (torch.nn.functional.pad(t, (0, width - d_qk)) for t in (q_THd, k_TKd))
        out = kernel(q_THd, k_TKd, torch.nn.functional.pad(v_TKv, (0, width - d_v)), docs, scale)
        return out[..., :d_v]

    return padded


def _flash_attn_varlen(q_THd: Tensor, k_TKd: Tensor, v_TKd: Tensor, docs: PackedDocuments, scale: float) -> Tensor:
    # Imported by name: an optional CUDA-only package, absent on CPU machines.
    flash_attn = importlib.import_module("flash_attn")
    max_len = docs.max_seqlen
    out: Tensor = flash_attn.flash_attn_varlen_func(
        q_THd, k_TKd, v_TKd, docs.cu_seqlens, docs.cu_seqlens, max_len, max_len, softmax_scale=scale, causal=True
    )
    return out


def _torch_varlen(q_THd: Tensor, k_TKd: Tensor, v_TKd: Tensor, docs: PackedDocuments, scale: float) -> Tensor:
    varlen_attn = _torch_varlen_function()
    if varlen_attn is None:  # guarded by selection; kept for a clear message if called directly
        raise AttentionBackendError(f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn")
    params = inspect.signature(varlen_attn).parameters
    kwargs: dict[str, Any] = {"scale": scale}
    # torch 2.10 spells causality is_causal=True; from 2.11 it is a (left, right) window of (-1, 0).
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0)
    else:
        kwargs["is_causal"] = True
    if q_THd.shape[1] != k_TKd.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            repeats = q_THd.shape[1] // k_TKd.shape[1]
            k_TKd = k_TKd.repeat_interleave(repeats, dim=1)
            v_TKd = v_TKd.repeat_interleave(repeats, dim=1)
    max_len = docs.max_seqlen
    out: Tensor = varlen_attn(q_THd, k_TKd, v_TKd, docs.cu_seqlens, docs.cu_seqlens, max_len, max_len, **kwargs)
    return out


@functools.cache
def _flash_attn_importable() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


@functools.cache
def _torch_varlen_function() -> Callable[..., Tensor] | None:
    try:
        module = importlib.import_module("torch.nn.attention.varlen")
    except ImportError:
        return None
    function: Callable[..., Tensor] | None = getattr(module, "varlen_attn", None)
    return function
