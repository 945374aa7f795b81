"""FSDP2 on the model core: the sharded model's forward methods give the unsharded model's results, in fp32
(with and without resharding after forward), with bf16 parameters and fp32 reduction, and on an HSDP mesh.

The forward methods the trainer calls are not ``forward`` (``forward_with_head``, ``forward_hidden``): FSDP2
hooks only ``__call__``, so unless they are registered as forward methods the first DTensor op fails."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from .compare import check, on_four_ranks, on_two_ranks
from .tiny import SEED, inputs_of_rank, logits_head, sigmoid_moe_config, unsharded


def _unsharded_outputs(tie: bool, ranks: int) -> list[dict[str, Any]]:
    model = unsharded(sigmoid_moe_config(tie=tie), SEED)
    outputs = []
    for rank in range(ranks):
        input_ids_1T, cu_seqlens = inputs_of_rank(rank, model.config.vocab_size)
        with torch.no_grad():
            logits_TV, stats = model.forward_with_head(input_ids_1T, cu_seqlens, head=logits_head)
            hidden_1TD = model.forward_hidden(input_ids_1T, cu_seqlens).hidden
        outputs.append({"logits": logits_TV, "hidden": hidden_1TD, "stats": stats})
    return outputs


def _assert_fp32_match(sharded: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    for rank, (got, want) in enumerate(zip(sharded, expected, strict=True)):
        torch.testing.assert_close(got["logits"], want["logits"], rtol=1e-5, atol=1e-5, msg=f"rank {rank}")
        torch.testing.assert_close(got["hidden"], want["hidden"], rtol=1e-5, atol=1e-5, msg=f"rank {rank}")
        # The same experts chosen for every token: routing is as sensitive a check as there is.
        for got_E, stats in zip(got["tokens_per_expert"], want["stats"], strict=True):
            assert torch.equal(got_E, stats.tokens_per_expert), f"rank {rank}"


@on_two_ranks
@pytest.mark.parametrize("variant", ["forward fp32", "forward fp32 no reshard"])
def test_fp32_sharded_forward_methods_match_the_unsharded_model(two_ranks: list[dict[str, Any]], variant: str) -> None:
    _assert_fp32_match(check(two_ranks, variant), _unsharded_outputs(tie=False, ranks=2))


@on_four_ranks
def test_hsdp_two_by_two_tied_forward_matches_the_unsharded_model(four_ranks: list[dict[str, Any]]) -> None:
    _assert_fp32_match(check(four_ranks, "forward hsdp tied"), _unsharded_outputs(tie=True, ranks=4))


@on_two_ranks
def test_bf16_parameters_with_fp32_reduction_stay_close_to_the_fp32_model(two_ranks: list[dict[str, Any]]) -> None:
    sharded = check(two_ranks, "forward bf16")
    for rank, (got, want) in enumerate(zip(sharded, _unsharded_outputs(tie=False, ranks=2), strict=True)):
        logits, expected = got["logits"], want["logits"]
        assert logits.dtype == torch.float32  # logits_head upcasts; the matmul ran in bf16
        # bf16 compute: a few bf16 ulps (2^-8 relative) accumulated over three layers, against logits of order 1.
        scale = float(expected.abs().max())
        error = float((logits - expected).abs().max())
        assert error < 0.05 * scale, f"rank {rank}: logits differ by {error:.3g} (scale {scale:.3g})"
        assert error > 0, f"rank {rank}: bit-identical to fp32, so the bf16 compute did not happen"
        # And the parameters really were cast for compute: every router saw bf16 weights.
        assert {weight for weight, _, _ in got["router dtypes in forward"]} == {torch.bfloat16}


@on_two_ranks
def test_each_group_is_gathered_once_more_in_backward_at_most(two_ranks: list[dict[str, Any]]) -> None:
    """One forward and backward with the router losses: a group resharded after forward is gathered twice (forward
    and backward), the last layer and the head, which stay gathered, once. The router statistics are outputs of
    every MoE layer; when FSDP hooked them as outputs of the forward method too, each statistics gradient ran the
    head group's hooks again, which gathered the head and the last layer a second time after their backward."""
    for rank, result in enumerate(check(two_ranks, "all-gathers of a step")):
        layers = result["layers"]
        expected = {"embed_tokens": 2, **{f"layers.{i}": 2 for i in range(layers - 1)}, f"layers.{layers - 1}": 1}
        expected["norm, lm_head"] = 1
        assert result["counts"] == expected, f"rank {rank}"
