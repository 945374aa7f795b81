"""Packed variable-length attention: documents never see each other, on every backend present here;
backend selection with injected capabilities; document boundaries and positions."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from xtrain.errors import AttentionBackendError
from xtrain.model.attention_backends import (
    CONCRETE_BACKENDS,
    Capabilities,
    attention_function,
    detect_capabilities,
    select_attention_backend,
)
from xtrain.model.documents import PackedDocuments

LENGTHS = [7, 1, 12, 4]


def _device_and_dtype(backend: str) -> tuple[torch.device, torch.dtype]:
    if backend == "sdpa":
        return torch.device("cpu"), torch.float64
    return torch.device("cuda"), torch.bfloat16


def _present(backend: str) -> bool:
    if backend != "sdpa" and not torch.cuda.is_available():
        return False
    device, dtype = _device_and_dtype(backend)
    caps = detect_capabilities(device, dtype)
    try:
        return select_attention_backend(backend, caps) == backend
    except AttentionBackendError:
        return False


def _naive_causal(q_LHd: torch.Tensor, k_LKd: torch.Tensor, v_LKd: torch.Tensor) -> torch.Tensor:
    """Textbook softmax(QKᵀ/√d + causal mask)·V for one document, GQA by repeating key/value heads."""
    groups = q_LHd.shape[1] // k_LKd.shape[1]
    k = k_LKd.repeat_interleave(groups, dim=1)
    v = v_LKd.repeat_interleave(groups, dim=1)
    scores_HLL = torch.einsum("qhd,khd->hqk", q_LHd, k) / math.sqrt(q_LHd.shape[-1])
    length = q_LHd.shape[0]
    future = torch.triu(torch.ones(length, length, dtype=torch.bool, device=q_LHd.device), diagonal=1)
    probs = scores_HLL.masked_fill(future, float("-inf")).softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


@pytest.mark.parametrize("backend", CONCRETE_BACKENDS)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (6, 1)])
def test_packed_equals_separate_forward_and_backward(backend: str, heads: int, kv_heads: int) -> None:
    if not _present(backend):
        pytest.skip(f"attention backend {backend} cannot run here")
    device, dtype = _device_and_dtype(backend)
    tolerance = 1e-10 if dtype == torch.float64 else 2e-2
    generator = torch.Generator().manual_seed(heads * 10 + kv_heads)
    total, head_dim = sum(LENGTHS), 16
    q = torch.randn(total, heads, head_dim, generator=generator, dtype=torch.float64).to(device, dtype)
    k = torch.randn(total, kv_heads, head_dim, generator=generator, dtype=torch.float64).to(device, dtype)
    v = torch.randn(total, kv_heads, head_dim, generator=generator, dtype=torch.float64).to(device, dtype)
    upstream = torch.randn(total, heads, head_dim, generator=generator, dtype=torch.float64).to(device, dtype)
    attend = attention_function(backend)
    scale = head_dim**-0.5

    packed_inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    docs = PackedDocuments.from_cu_seqlens(cu, total, device)
    packed_out = attend(*packed_inputs, docs, scale)
    (packed_out * upstream).sum().backward()

    start = 0
    for length in LENGTHS:
        piece = slice(start, start + length)
        alone = [t[piece].clone().requires_grad_() for t in (q, k, v)]
        one_doc = PackedDocuments.from_cu_seqlens(None, length, device)
        alone_out = attend(*alone, one_doc, scale)
        (alone_out * upstream[piece]).sum().backward()
        torch.testing.assert_close(packed_out[piece], alone_out, atol=tolerance, rtol=tolerance)
        reference = _naive_causal(*(t[piece].double() for t in (q, k, v)))
        torch.testing.assert_close(alone_out.double(), reference, atol=tolerance, rtol=tolerance)
        for packed_input, alone_input in zip(packed_inputs, alone, strict=True):
            assert packed_input.grad is not None and alone_input.grad is not None
            torch.testing.assert_close(packed_input.grad[piece], alone_input.grad, atol=tolerance, rtol=tolerance)
        start += length


def _caps(device_type: str = "cuda", dtype: torch.dtype = torch.bfloat16, flash: bool = True, varlen: bool = True):
    return Capabilities(device_type=device_type, dtype=dtype, flash_attn_importable=flash, torch_varlen_present=varlen)


@pytest.mark.parametrize(
    ("caps", "expected"),
    [
        (_caps(), "flash_attn"),
        (_caps(flash=False), "torch_varlen"),
        (_caps(flash=False, varlen=False), "sdpa"),
        (_caps(dtype=torch.float32), "sdpa"),  # the varlen kernels take half precision only
        (_caps(device_type="cpu"), "sdpa"),
        (_caps(device_type="cpu", dtype=torch.float32, flash=False, varlen=False), "sdpa"),
    ],
)
def test_auto_picks_the_best_available_backend(caps: Capabilities, expected: str) -> None:
    assert select_attention_backend("auto", caps) == expected


@pytest.mark.parametrize(
    ("requested", "caps", "reason"),
    [
        ("flash_attn", _caps(flash=False), "flash_attn package is not installed"),
        ("flash_attn", _caps(device_type="cpu"), "needs a CUDA device"),
        ("torch_varlen", _caps(varlen=False), "has no torch.nn.attention.varlen"),
        ("torch_varlen", _caps(dtype=torch.float32), "fp16 or bf16"),
    ],
)
def test_an_unavailable_requested_backend_fails_with_the_reason(
    requested: str, caps: Capabilities, reason: str
) -> None:
    with pytest.raises(AttentionBackendError, match=reason):
        select_attention_backend(requested, caps)


def test_a_requested_available_backend_is_used_as_is() -> None:
    assert select_attention_backend("torch_varlen", _caps()) == "torch_varlen"
    assert select_attention_backend("sdpa", _caps()) == "sdpa"


def test_unknown_backend_name_is_rejected() -> None:
    with pytest.raises(AttentionBackendError, match="unknown attention backend 'flex'"):
        select_attention_backend("flex", _caps())


def test_this_cpu_machine_detects_no_cuda_kernels() -> None:
    caps = detect_capabilities(torch.device("cpu"), torch.float32)
    assert caps.device_type == "cpu"
    assert select_attention_backend("auto", caps) == "sdpa"
    with pytest.raises(AttentionBackendError, match="needs a CUDA device"):
        select_attention_backend("flash_attn", caps)


def test_positions_restart_in_every_document() -> None:
    cu = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    docs = PackedDocuments.from_cu_seqlens(cu, 8, torch.device("cpu"))
    assert docs.lengths == (3, 1, 4)
    assert docs.max_seqlen == 4
    assert docs.position_ids.tolist() == [0, 1, 2, 0, 0, 1, 2, 3]
    single = PackedDocuments.from_cu_seqlens(None, 5, torch.device("cpu"))
    assert single.position_ids.tolist() == [0, 1, 2, 3, 4]
    assert single.cu_seqlens.tolist() == [0, 5]


@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=12))
@settings(max_examples=60, deadline=None)
def test_positions_and_boundaries_for_any_lengths(lengths: list[int]) -> None:
    docs = PackedDocuments.from_lengths(lengths, torch.device("cpu"))
    assert docs.position_ids.tolist() == [p for length in lengths for p in range(length)]
    assert docs.cu_seqlens.tolist() == [0, *itertools.accumulate(lengths)]
    again = PackedDocuments.from_cu_seqlens(docs.cu_seqlens, sum(lengths), torch.device("cpu"))
    assert again.lengths == tuple(lengths) and torch.equal(again.position_ids, docs.position_ids)


def test_documents_from_host_lengths_equal_those_from_cu_seqlens() -> None:
    from_lengths = PackedDocuments.from_lengths([3, 1, 4], torch.device("cpu"))
    from_cu = PackedDocuments.from_cu_seqlens(torch.tensor([0, 3, 4, 8], dtype=torch.int32), 8, torch.device("cpu"))
    assert from_lengths.lengths == from_cu.lengths
    assert torch.equal(from_lengths.cu_seqlens, from_cu.cu_seqlens)
    assert torch.equal(from_lengths.position_ids, from_cu.position_ids)
    with pytest.raises(ValueError, match="must be positive"):
        PackedDocuments.from_lengths([3, 0], torch.device("cpu"))


@pytest.mark.parametrize(
    ("cu", "message"),
    [
        ([0, 3, 7], "end at the row length 8"),
        ([1, 3, 8], "start at 0"),
        ([0, 3, 3, 8], "strictly increasing"),
        ([0], "start at 0 and end"),
    ],
)
def test_bad_cu_seqlens_are_rejected(cu: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PackedDocuments.from_cu_seqlens(torch.tensor(cu, dtype=torch.int32), 8, torch.device("cpu"))


def test_cu_seqlens_must_be_integer() -> None:
    with pytest.raises(ValueError, match="1-D int32"):
        PackedDocuments.from_cu_seqlens(torch.tensor([0.0, 8.0]), 8, torch.device("cpu"))
