"""Resuming on another world size and HSDP shape: DCP reshards model and optimizer, the data position does not
depend on the world size. 2 processes → 4 (HSDP, 2 replicas × 2 shards) → 2 (plain FSDP): every step after a
resume trains on exactly the packs of the uninterrupted run (none seen twice, none skipped) with losses within
1e-5 of it (fp32; only the order of the sums over ranks differs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.checkpoint.cli_runs import latest_per_step, metrics, pack_ids
from tests.engine.parallel.ranks import run_ranks
from tests.engine.train.plain_loop import relative
from tests.engine.train.run_trainer import load

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

LOSS_RTOL = 1e-5


def _overrides(cache_dir: Path, replicate: int = 1) -> tuple[str, ...]:
    # 4 packs per step: 2 micro-batches per rank on 2 processes, 1 on 4. The load-balancing loss's gradient uses
    # an estimate of the step's counts with several micro-batches (xtrain.train.step): coefficient 0 here, so the
    # runs differ only in the order of sums. Asynchronous saves: the checkpoints loaded here were written by them.
    return (
        "train.max_steps=6",
        "train.global_batch=4",
        "data.pack_tokens=64",
        f"data.cache_dir={cache_dir}",
        'parallel.mixed_precision="fp32"',
        "trace.profile_steps=[]",
        "trace.enabled=false",
        "loss.aux_loss_coef=0.0",
        "checkpoint.every_steps=2",
        "checkpoint.async=true",
        f"parallel.replicate={replicate}",
    )


def _train(overrides: tuple[str, ...], run_dir: str, resume: str) -> None:
    from xtrain.train import trainer

    trainer.train(load(overrides), Path(run_dir), resume=resume)


def _run(world_size: int, overrides: tuple[str, ...], run_dir: Path, resume: str = "auto") -> None:
    run_ranks(world_size, _train, overrides, str(run_dir), resume, tmp_dir=run_dir.parent / f"{run_dir.name}-ipc")


def _assert_continues(run_dir: Path, world_size: int, reference: Path, steps: range) -> None:
    ours, theirs = latest_per_step(metrics(run_dir)), latest_per_step(metrics(reference))
    assert sorted(ours) == list(steps)
    for step in steps:
        for key in ("loss", "z_loss", "grad_norm"):
            assert relative(ours[step][key], theirs[step][key]) < LOSS_RTOL, (step, key, ours[step], theirs[step])
        assert ours[step]["lr"] == theirs[step]["lr"]
    packs, expected = pack_ids(run_dir, world_size), pack_ids(reference, 2)
    assert {s: packs[s] for s in steps} == {s: expected[s] for s in steps}


def test_resume_from_2_on_4_hsdp_then_from_4_on_2(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    reference = tmp_path / "reference"
    _run(2, _overrides(cache), reference)

    hsdp = tmp_path / "on-4"
    _run(4, _overrides(cache, replicate=2), hsdp, resume=str(reference / "checkpoints" / "step-2"))
    _assert_continues(hsdp, 4, reference, range(3, 7))
    assert metrics(hsdp)[0]["resumed_from_world_size"] == 2

    back = tmp_path / "back-on-2"
    _run(2, _overrides(cache), back, resume=str(hsdp / "checkpoints" / "step-4"))
    _assert_continues(back, 2, reference, range(5, 7))
    assert metrics(back)[0]["resumed_from_world_size"] == 4
