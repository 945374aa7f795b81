"""The sigmoid router's correction bias stays fp32: through meta → ``.to(bf16)`` → ``to_empty`` (how a bf16
model is built and how ``load_hf(dtype=bf16)`` builds one), through ``.to(bf16)`` of a real model (values kept
exactly), and under FSDP2's bf16 mixed precision, which casts parameters for compute but leaves buffers alone
(the bias is a buffer: a plain fp32 tensor, not a DTensor, in every forward)."""

from __future__ import annotations

from typing import Any

import torch
from xtrain.model.transformer import Transformer

from .compare import check, on_two_ranks
from .tiny import SEED, sigmoid_moe_config, unsharded


def _biases(model: Transformer) -> dict[str, torch.Tensor]:
    biases = {name: b for name, b in model.named_buffers() if name.endswith("e_score_correction_bias")}
    assert len(biases) == 2  # the two MoE layers of the tiny config
    return biases


def test_bias_stays_fp32_through_meta_to_bf16_to_empty() -> None:
    with torch.device("meta"):
        model = Transformer(sigmoid_moe_config())
    model.to(torch.bfloat16)
    assert {b.dtype for b in _biases(model).values()} == {torch.float32}
    model.to_empty(device="cpu")
    assert {b.dtype for b in _biases(model).values()} == {torch.float32}
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    model.init_weights(SEED)
    assert all(torch.equal(b, torch.zeros_like(b)) for b in _biases(model).values())


def test_bias_keeps_its_exact_values_through_to_bf16() -> None:
    model = unsharded(sigmoid_moe_config(), SEED)
    for bias in _biases(model).values():
        bias.add_(1.0 + 1e-4)  # near 1, where bf16's spacing (2^-7) would round the 1e-4 away
    before = {name: b.clone() for name, b in _biases(model).items()}
    model.to(torch.bfloat16)
    for name, bias in _biases(model).items():
        assert bias.dtype == torch.float32 and torch.equal(bias, before[name]), name


@on_two_ranks
def test_bias_is_an_fp32_plain_tensor_under_fsdp_bf16_mixed_precision(two_ranks: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(check(two_ranks, "forward bf16")):
        seen = result["router dtypes in forward"]
        assert len(seen) == 4, f"rank {rank}: {seen}"  # two MoE layers, in forward_with_head and forward_hidden
        for weight_dtype, bias_dtype, bias_is_dtensor in seen:
            assert weight_dtype == torch.bfloat16  # the policy is on: parameters are cast for compute
            assert bias_dtype == torch.float32 and not bias_is_dtensor, f"rank {rank}: {seen}"
