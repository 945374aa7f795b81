"""A run with data-parallel balance (data.balance_window) resumed from a checkpoint taken in the middle of a
window trains on exactly the packs of the uninterrupted run, at the same ranks and micro-steps, with the same
losses."""

from __future__ import annotations

from pathlib import Path

import pytest
from xtrain.data import PackStream, prepare_corpus
from xtrain.data.balance import pack_cost
from xtrain.data.packing import Balance

from tests.engine.checkpoint.cli_runs import latest_per_step, metrics, pack_ids, read_jsonl
from tests.engine.parallel.ranks import run_ranks
from tests.engine.train.plain_loop import relative
from tests.engine.train.run_trainer import load

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def _overrides(cache_dir: Path) -> tuple[str, ...]:
    return (
        "train.max_steps=4",
        "train.global_batch=4",
        "data.pack_tokens=64",
        "data.balance_window=3",  # the checkpoint at step 2 falls inside the first window (steps 1-3)
        f"data.cache_dir={cache_dir}",
        'parallel.mixed_precision="fp32"',
        "trace.profile_steps=[]",
        "trace.enabled=false",
        "checkpoint.every_steps=2",
    )


def _train(overrides: tuple[str, ...], run_dir: str, resume: str) -> None:
    from xtrain.train import trainer

    trainer.train(load(overrides), Path(run_dir), resume=resume)


def _run(overrides: tuple[str, ...], run_dir: Path, resume: str = "auto") -> None:
    run_ranks(2, _train, overrides, str(run_dir), resume, tmp_dir=run_dir.parent / f"{run_dir.name}-ipc")


def test_a_balanced_run_resumes_mid_window_exactly(tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    _run(_overrides(tmp_path / "cache"), reference)
    resumed = tmp_path / "resumed"
    _run(_overrides(tmp_path / "cache"), resumed, resume=str(reference / "checkpoints" / "step-2"))

    ours, theirs = latest_per_step(metrics(resumed)), latest_per_step(metrics(reference))
    assert sorted(ours) == [3, 4]
    for step in ours:
        for key in ("loss", "aux_loss", "z_loss", "grad_norm"):
            assert relative(ours[step][key], theirs[step][key]) < 1e-6, (step, key)
    # The same packs, on the same ranks in the same order (pack_ids lists rank 0's micro-steps, then rank 1's).
    packs, expected = pack_ids(resumed, 2), pack_ids(reference, 2)
    assert {s: packs[s] for s in (3, 4)} == {s: expected[s] for s in (3, 4)}
    # The ranks trained on the balanced plan (not the stream order): their attention costs are the plan's.
    config = load(_overrides(tmp_path / "cache"))
    corpus = prepare_corpus(config.data)
    plan = PackStream(corpus, 64, seed=0, lookahead=config.data.pack_lookahead, balance=Balance(3, 4, 2))
    plain = PackStream(corpus, 64, seed=0, lookahead=config.data.pack_lookahead)
    logged = [latest_per_step(read_jsonl(reference / "ranks" / f"rank-{rank}.jsonl")) for rank in range(2)]
    balanced_costs, plain_costs, ran = [], [], []
    for step in range(1, 5):
        for stream, costs in ((plan, balanced_costs), (plain, plain_costs)):
            packs = stream.next_packs(4)
            costs += [sum(pack_cost(p.pieces) for p in packs[rank * 2 : rank * 2 + 2]) for rank in range(2)]
        ran += [logged[rank][step]["attention_cost"] for rank in range(2)]
    assert ran == balanced_costs != plain_costs
