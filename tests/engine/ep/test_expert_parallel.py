"""Expert parallelism on real gloo processes (2 and 4 ranks): every ep_size and Domino slicing gives the losses
and gradients of plain FSDP over the same ranks (fp32, within 1e-5), with uneven expert loads (experts without
rows on some rank, a rank that receives no row at all), GPT-OSS's biased experts, the trainer's own step, and one
gradient reduction per group whatever the number of slices."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ..parallel.compare import marked

TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


on_two_ranks = marked("ep-two-ranks")
on_four_ranks = marked("ep-four-ranks")


def _check(results: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    for result in results:
        assert "error" not in result[name], result[name]["error"]
    return [result[name] for result in results]


def _assert_same(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    torch.testing.assert_close(got["losses"], want["losses"], **TOLERANCE, msg=f"{what}: losses")
    assert torch.equal(got["counts"], want["counts"]), f"{what}: a token chose other experts"
    assert got["grads"].keys() == want["grads"].keys(), what
    for name, grad in want["grads"].items():
        assert grad.abs().max() > 0, f"{name} has no gradient to compare"
        torch.testing.assert_close(got["grads"][name], grad, **TOLERANCE, msg=f"{what}: gradient of {name}")


def _layouts(results: list[dict[str, Any]], name: str) -> dict[tuple[int, int], Any]:
    layouts: dict[tuple[int, int], Any] = _check(results, name)[0]["layouts"]
    return layouts


@on_two_ranks
@pytest.mark.parametrize("check", ["layouts", "biased experts", "uneven load"])
def test_ep2_and_domino_give_the_losses_and_gradients_of_plain_fsdp(ep_two_ranks: list[Any], check: str) -> None:
    layouts = _layouts(ep_two_ranks, check)
    plain = layouts[(1, 1)]
    for layout, result in layouts.items():
        _assert_same(result, plain, f"{check}, ep_size {layout[0]} with {layout[1]} slices")


@on_four_ranks
@pytest.mark.parametrize("check", ["layouts", "uneven load"])
def test_ep2_ep4_with_domino_on_four_ranks_match_plain_fsdp(ep_four_ranks: list[Any], check: str) -> None:
    # ep 2 on four ranks: each expert group is FSDP-sharded over two ranks (a real reduce-scatter of its
    # gradients); ep 4: one rank per expert group.
    layouts = _layouts(ep_four_ranks, check)
    assert len(layouts) > 1
    for layout, result in layouts.items():
        _assert_same(result, layouts[(1, 1)], f"{check}, ep_size {layout[0]} with {layout[1]} slices")


@on_two_ranks
def test_uneven_load_really_leaves_experts_and_a_whole_rank_without_rows(ep_two_ranks: list[Any]) -> None:
    per_rank = [result["local counts"][(2, 3)] for result in _check(ep_two_ranks, "uneven load")]
    total_LE = per_rank[0] + per_rank[1]
    # Experts 4-7 live on ep rank 1 at ep_size 2: no rank sends it a row.
    assert not total_LE[:, 4:].any() and total_LE[:, :4].all()
    # Experts 2 and 3 get rows from rank 0 but none from rank 1.
    assert per_rank[0][:, 2:4].all() and not per_rank[1][:, 2:4].any()


@on_four_ranks
def test_uneven_load_on_four_ranks_leaves_two_ranks_without_rows(ep_four_ranks: list[Any]) -> None:
    per_rank = [result["local counts"][(4, 2)] for result in _check(ep_four_ranks, "uneven load")]
    # At ep_size 4 ranks 2 and 3 hold experts 4-5 and 6-7: nobody routes a token there.
    assert not sum(per_rank)[:, 4:].any()


@on_two_ranks
def test_domino_slices_reduce_each_gradient_group_once(ep_two_ranks: list[Any]) -> None:
    counted = _check(ep_two_ranks, "reductions")[0]
    plain, sliced = counted["ep 2 slices 1"], counted["ep 2 slices 3"]
    # Groups: embedding, three layers, two experts groups, head, root; a second call per slice would add more.
    assert plain == sliced and plain > 0, counted


def _assert_same_step(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    for field in ("loss", "aux_loss", "z_loss", "grad_norm"):
        value = getattr(got["step"], field)
        assert value == pytest.approx(getattr(want["step"], field), rel=1e-5, abs=1e-7), (what, field)
    assert want["step"].grad_norm > 0.05, "clipping should take part"
    assert not got["step"].skipped, what
    # After one SGD step (clipped gradients, router bias update from the global counts) the weights agree.
    assert got["state"].keys() == want["state"].keys(), what
    for name, tensor in want["state"].items():
        torch.testing.assert_close(got["state"][name], tensor, **TOLERANCE, msg=f"{what}: {name}")


@on_two_ranks
def test_the_trainer_step_under_ep_matches_plain_fsdp(ep_two_ranks: list[Any]) -> None:
    steps = _check(ep_two_ranks, "train_step")[0]
    _assert_same_step(steps["2x2"], steps["1x1"], "ep 2 with 2 slices")


@on_four_ranks
def test_ep_inside_hsdp_replicas_steps_like_plain_fsdp(ep_four_ranks: list[Any]) -> None:
    # replicate 2 × ep 2 on four ranks: experts split over the two ranks of each replica, gradients all-reduced
    # over the replicas; the losses, the gradient norm (each parameter counted once) and the weights after one
    # clipped step are those of plain FSDP and of HSDP without EP.
    steps = _check(ep_four_ranks, "replicas")[0]
    for name in ("hsdp", "hsdp ep 2", "hsdp ep 2 domino"):
        _assert_same_step(steps[name], steps["fsdp"], name)


@on_two_ranks
def test_checkpointed_layers_under_ep_replay_their_exchanges_instead_of_communicating(
    ep_two_ranks: list[Any],
) -> None:
    results = _check(ep_two_ranks, "checkpointed")
    layouts = results[0]["layouts"]
    _assert_same(layouts["ep 2 checkpointed"], layouts["plain"], "every layer checkpointed, ep 2 with 3 slices")
    # Two MoE layers, 3 slices: per layer one counts exchange, a dispatch and a combine per slice in forward, their
    # gradients in backward. Each once: the recompute took the forward's from the tape (else each forward name
    # would be waited for twice).
    slices = [f"{kind} slice {i}" for kind in ("dispatch", "combine") for i in range(3)]
    expected = dict.fromkeys(["split sizes", *slices, *(f"{name} backward" for name in slices)], 2)
    for result in results:
        assert result["waits"] == expected
