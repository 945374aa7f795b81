"""Expert parallelism through ``xtrain train``'s trainer (fp32, CPU, gloo): ep_size 2 on 2 processes, 4 on 4 and
ep_size 2 inside HSDP replicas (replicate 2) on 4 and on 8 (where each EP rank's experts are FSDP-sharded over 2
ranks inside the replica) train like ep_size 1 on as many processes (losses, gradient norms and weights within
1e-5), and so do Domino slices and
checkpointing + offload on top; a checkpoint saved at one ep_size resumes at another, continuing the uninterrupted
run's losses and packs (one saved under replicate 2 × ep 2 too); the all-to-alls are in the deeptrace trace as COMM
spans.

Several runs share one set of processes (the trainer starts and ends its process group each time): spawning and
importing costs seconds per process on two cores.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from deeptrace.collect.reader import read_trace
from deeptrace.spans import Category

from tests.engine.checkpoint.cli_runs import latest_per_step, metrics, pack_ids
from tests.engine.parallel.ranks import free_port, run_ranks
from tests.engine.train.plain_loop import relative
from tests.engine.train.run_trainer import debug_config, load

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

RTOL = 1e-5


def _settings(cache_dir: Path, packs: int = 4) -> tuple[str, ...]:
    """3 steps of `packs` packs of 64 tokens. AdamW's epsilon at 1e-2 makes its update nearly linear in the gradient:
    with the default 1e-8 it divides by the gradient's own scale, so wherever a gradient is near zero the rounding
    of the sums (which the layouts order differently) becomes a full-size update of that element (seen: 4e-5 after
    4 steps), and comparing weights within 1e-5 would compare rounding. With it, a wrong gradient still moves the
    weights by the size of an update (about 1e-3 per step), far beyond the tolerance."""
    return debug_config(
        cache_dir, f"train.global_batch={packs}", "train.max_steps=3", "data.pack_tokens=64", "optim.eps=0.01"
    )


KEYS = ("loss", "aux_loss", "z_loss", "grad_norm")

Run = tuple[str, tuple[str, ...], str]  # name (its run directory), overrides, --resume


def _full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _train_runs(runs: list[Run], root: str, ports: list[int]) -> dict[str, dict[str, torch.Tensor] | None]:
    """Every run in turn in this rank; rank 0's full weights after each. Each run's process group rendezvous at
    a port of its own: one reused right after the previous group's store closed can meet that store's keys."""
    from xtrain.train import trainer

    weights = {}
    for (name, overrides, resume), port in zip(runs, ports, strict=True):
        os.environ["MASTER_PORT"] = str(port)
        result = trainer.train(load(overrides), Path(root, name), resume=resume, finish=_full_weights)
        weights[name] = result if os.environ["RANK"] == "0" else None
    return weights


def _run_all(world_size: int, runs: list[Run], root: Path) -> dict[str, dict[str, torch.Tensor]]:
    ports: list[int] = []
    while len(ports) < len(runs):  # one port per run, each its own
        if (port := free_port()) not in ports:
            ports.append(port)
    results = run_ranks(world_size, _train_runs, runs, str(root), ports, tmp_dir=root / "ipc")
    return {name: weights for name, weights in results[0].items() if weights is not None}


def _assert_same_losses(run_dir: Path, reference: Path, steps: range) -> None:
    ours, theirs = latest_per_step(metrics(run_dir)), latest_per_step(metrics(reference))
    assert sorted(ours) == list(steps), (run_dir.name, sorted(ours))
    for step in steps:
        for key in KEYS:
            assert relative(ours[step][key], theirs[step][key]) < RTOL, (run_dir.name, step, key, ours[step][key])
        assert ours[step]["lr"] == theirs[step]["lr"]
    assert all(ours[step]["aux_loss"] > 0 for step in steps)  # the router losses were really there


def _assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    assert sorted(got) == sorted(want), what
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=RTOL, atol=RTOL, msg=f"{what}: {name}")


def _exchange_spans(run_dir: Path, rank: int) -> list[str]:
    return [span.name for span in read_trace(run_dir / "trace" / f"rank-{rank}.dtr") if span.category == Category.COMM]


def test_ep2_domino_memory_and_resume_across_ep_sizes_on_two_processes(tmp_path: Path) -> None:
    # 4 packs per step: 2 micro-batches per rank (gradient accumulation under EP), the same split in every run.
    base = _settings(tmp_path / "cache")
    saving = (*base, "checkpoint.every_steps=2")
    domino = (*base, "parallel.ep_size=2", "parallel.domino_slices=2")
    runs: list[Run] = [
        ("ep1", saving, "none"),
        ("ep2", (*saving, "parallel.ep_size=2"), "none"),
        ("domino", domino, "none"),
        ("memory", (*domino, 'memory.checkpointing="full"', "memory.offload=true"), "none"),
        ("ep1-to-ep2", (*base, "parallel.ep_size=2"), str(tmp_path / "ep1" / "checkpoints" / "step-2")),
        ("ep2-to-ep1", base, str(tmp_path / "ep2" / "checkpoints" / "step-2")),
    ]
    weights = _run_all(2, runs, tmp_path)

    for name in ("ep2", "domino", "memory"):
        _assert_same_losses(tmp_path / name, tmp_path / "ep1", range(1, 4))
        _assert_same_weights(weights[name], weights["ep1"], name)
    # Resumed at step 2 with the other ep_size: step 3 of the uninterrupted run, on its packs.
    for name, source in (("ep1-to-ep2", "ep1"), ("ep2-to-ep1", "ep2")):
        _assert_same_losses(tmp_path / name, tmp_path / source, range(3, 4))
        assert metrics(tmp_path / name)[0]["resumed_from_step"] == 2
        packs, expected = pack_ids(tmp_path / name, 2), pack_ids(tmp_path / source, 2)
        assert packs[3] == expected[3]
        _assert_same_weights(weights[name], weights[source], name)

    # The exchanges are deeptrace COMM spans (a dispatch and a combine per slice, their gradients); ep 1 has none.
    for rank in range(2):
        names = set(_exchange_spans(tmp_path / "domino", rank))
        assert {f"all_to_all {kind} slice {i}" for kind in ("dispatch", "combine") for i in range(2)} <= names
        assert "all_to_all dispatch slice 1 backward" in names
        assert not any(name.startswith("all_to_all") for name in _exchange_spans(tmp_path / "ep1", rank))


def test_ep4_and_ep_inside_hsdp_replicas_on_four_processes_train_like_ep1(tmp_path: Path) -> None:
    # One pack per rank; ep 2 on four processes: each expert group is FSDP-sharded over two ranks. replicate 2 ×
    # ep 2: two replicas, the experts split over the two ranks of each, their gradients all-reduced across the
    # replicas (HSDP) like every other parameter's; HSDP without EP for comparison. Its checkpoint at step 2
    # resumes on plain FSDP (ep 1) as step 3 of the uninterrupted run.
    base = _settings(tmp_path / "cache")
    hsdp_ep2 = (*base, "parallel.replicate=2", "parallel.ep_size=2", "checkpoint.every_steps=2")
    runs: list[Run] = [
        ("ep1", base, "none"),
        ("ep4", (*base, "parallel.ep_size=4", "parallel.domino_slices=2"), "none"),
        ("ep2", (*base, "parallel.ep_size=2"), "none"),
        ("hsdp", (*base, "parallel.replicate=2"), "none"),
        ("hsdp-ep2", hsdp_ep2, "none"),
        ("hsdp-ep2-to-ep1", base, str(tmp_path / "hsdp-ep2" / "checkpoints" / "step-2")),
    ]
    weights = _run_all(4, runs, tmp_path)
    for name in ("ep4", "ep2", "hsdp", "hsdp-ep2"):
        _assert_same_losses(tmp_path / name, tmp_path / "ep1", range(1, 4))
        _assert_same_weights(weights[name], weights["ep1"], name)
    _assert_same_losses(tmp_path / "hsdp-ep2-to-ep1", tmp_path / "hsdp-ep2", range(3, 4))
    assert metrics(tmp_path / "hsdp-ep2-to-ep1")[0]["resumed_from_step"] == 2
    _assert_same_weights(weights["hsdp-ep2-to-ep1"], weights["hsdp-ep2"], "hsdp-ep2-to-ep1")


def test_ep_inside_hsdp_replicas_with_experts_fsdp_sharded_on_eight_processes_trains_like_ep1(tmp_path: Path) -> None:
    # replicate 2 × shard 4 with ep 2: inside each replica of 4 ranks the experts are split over 2 EP ranks and
    # each EP rank's experts are FSDP-sharded over the other 2 (the experts' own FSDP mesh has more than one rank
    # per replica, which four processes cannot show), then all-reduced across the replicas. One pack per rank.
    base = _settings(tmp_path / "cache", packs=8)
    runs: list[Run] = [
        ("ep1", base, "none"),
        ("hsdp-ep2", (*base, "parallel.replicate=2", "parallel.ep_size=2"), "none"),
    ]
    weights = _run_all(8, runs, tmp_path)
    _assert_same_losses(tmp_path / "hsdp-ep2", tmp_path / "ep1", range(1, 4))
    _assert_same_weights(weights["hsdp-ep2"], weights["ep1"], "hsdp-ep2")
