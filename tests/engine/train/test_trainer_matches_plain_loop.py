"""The trainer (FSDP2, chunked loss, gradient accumulation, global-batch losses) against a plain unsharded
PyTorch loop (tests/engine/train/plain_loop.py), in fp32 on CPU: same losses and same weights after 3 steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.engine.train.plain_loop import assert_same_training, plain_training, relative
from tests.engine.train.run_trainer import debug_config, load, train_in_ranks

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

# Sharded reductions and the chunked loss sum in another order than the plain loop: fp32 rounding, no more.
LOSS_RTOL = 2e-5


def _metrics(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _assert_same_history(metrics: list[dict[str, float]], reference: list[dict[str, float]], keys: list[str]) -> None:
    assert [m["step"] for m in metrics] == list(range(1, len(reference) + 1))
    for logged, expected in zip(metrics, reference, strict=True):
        for key in keys:
            assert relative(logged[key], expected[key]) < LOSS_RTOL, (logged["step"], key, logged[key], expected[key])


def test_two_fsdp_processes_train_like_one_plain_process(tmp_path: Path) -> None:
    # One pack per rank: the load-balancing loss's global counts are known exactly (see xtrain.train.step).
    overrides = debug_config(tmp_path / "cache", "train.global_batch=2")
    weights = train_in_ranks(2, overrides, tmp_path / "run")
    reference, initial, expected_weights = plain_training(load(overrides))

    metrics = _metrics(tmp_path / "run")
    _assert_same_history(metrics, reference, ["loss", "aux_loss", "z_loss", "grad_norm"])
    assert all(m["aux_loss"] > 0 and m["z_loss"] > 0 for m in metrics)  # the router losses were really there
    assert_same_training(weights, expected_weights, initial)
    _assert_run_directory(tmp_path / "run", world_size=2, steps=3)


def _assert_run_directory(run_dir: Path, *, world_size: int, steps: int) -> None:
    """What the run directory holds besides metrics.jsonl (docs/run-directory.md)."""
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["world_size"] == world_size and meta["model_flops_per_token"] > 0
    assert "max_steps = 3" in (run_dir / "config.toml").read_text()  # the resolved config, overrides applied
    metric = _metrics(run_dir)[-1]
    for key in ("tokens", "tokens_per_s", "tokens_per_s_per_device", "lr", "skipped_lines", "skipped_steps", "wall_s"):
        assert key in metric, key
    for rank in range(world_size):
        records = [json.loads(line) for line in (run_dir / "ranks" / f"rank-{rank}.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records] == list(range(1, steps + 1))
        assert all(r["mem_peak_bytes"] > 0 and r["step_time_s"] > 0 and r["data_wait_s"] >= 0 for r in records)
        heartbeat = json.loads((run_dir / "heartbeat" / f"rank-{rank}.json").read_text())
        assert heartbeat["step"] == steps, heartbeat
        assert (run_dir / "logs" / f"rank-{rank}.log").read_text().strip()
        assert (run_dir / "trace" / f"rank-{rank}.dtr").stat().st_size > 0


def test_losses_and_weights_do_not_depend_on_how_the_global_batch_is_split(tmp_path: Path) -> None:
    # 4 packs per step as 1 process x 4 micro-batches, 2 x 2 and 4 x 1. The load-balancing loss's coefficient is
    # 0 here: with several micro-batches per rank its gradient uses an estimate of the step's counts (documented
    # in xtrain.train.step), so only its logged value, not its gradient, is split-invariant. The z-loss is exact.
    overrides = debug_config(tmp_path / "cache", "train.global_batch=4", "loss.aux_loss_coef=0.0")
    reference, initial, expected_weights = plain_training(load(overrides))
    # 4 processes as HSDP: 2 replicas, each sharded over 2 ranks.
    for world_size, replicate in ((1, 1), (2, 1), (4, 2)):
        run_dir = tmp_path / f"run-{world_size}"
        weights = train_in_ranks(world_size, (*overrides, f"parallel.replicate={replicate}"), run_dir)
        _assert_same_history(_metrics(run_dir), reference, ["loss", "aux_loss", "z_loss", "grad_norm"])
        assert_same_training(weights, expected_weights, initial)


def test_checkpointing_and_offload_leave_losses_and_weights_unchanged(tmp_path: Path) -> None:
    # 2 FSDP processes x 2 micro-batches: the recompute and the offload's buffers across gradient accumulation.
    # (The other policies select other layers of the same wrapper: tests/engine/parallel/test_checkpointing.py.)
    overrides = debug_config(tmp_path / "cache", "train.global_batch=4", "loss.aux_loss_coef=0.0")
    reference, initial, expected_weights = plain_training(load(overrides))
    memory = ('memory.checkpointing="full"', "memory.offload=true")
    weights = train_in_ranks(2, (*overrides, *memory), tmp_path / "run")
    _assert_same_history(_metrics(tmp_path / "run"), reference, ["loss", "aux_loss", "z_loss", "grad_norm"])
    assert_same_training(weights, expected_weights, initial)
