"""A 2-process ``xtrain train`` killed with SIGKILL, then ``--resume auto``: every later step's numbers are
bit-identical to a run never killed (CPU, fp32), whether the kill lands between saves or in the middle of one.

A kill between saves is the same case with less left on disk; asynchronous saves are killed and resumed
bit-identically in tests/integration/test_clusterx_retry.py.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.engine.checkpoint.cli_runs import (
    DEBUG_CONFIG,
    EXACT_KEYS,
    complete,
    environment,
    latest_per_step,
    metrics,
    pack_ids,
    rank_process,
    short_run,
    start_xtrain,
    steps_logged,
    wait_until,
    xtrain,
)

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

STEPS = 6


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run: 6 steps, checkpoints at 2, 4, 6 (sync)."""
    root = tmp_path_factory.mktemp("reference")
    run_dir = root / "run"
    result = xtrain("train", DEBUG_CONFIG, "--nproc", "2", "--run-dir", run_dir, *short_run(root / "cache"), cwd=root)
    assert result.returncode == 0, result.stdout + result.stderr
    return run_dir


def _resume(run_dir: Path, cwd: Path, *overrides: str) -> str:
    args = ("train", DEBUG_CONFIG, "--nproc", "2", "--run-dir", run_dir, "--resume", "auto")
    result = xtrain(*args, *short_run(cwd / "cache", *overrides), cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stderr


def _assert_continues_exactly(run_dir: Path, reference: Path, resumed_from: int) -> None:
    records = metrics(run_dir)
    marked = [r for r in records if "resumed_from_step" in r]
    assert [r["resumed_from_step"] for r in marked] == [resumed_from], marked  # the resume is marked, once
    assert marked[0]["step"] == resumed_from + 1 and marked[0]["resumed_from_world_size"] == 2
    after = latest_per_step(records[records.index(marked[0]) :])
    expected = latest_per_step(metrics(reference))
    assert sorted(after) == list(range(resumed_from + 1, STEPS + 1))
    for step, record in after.items():
        for key in EXACT_KEYS:
            assert record[key] == expected[step][key], (step, key, record[key], expected[step][key])  # bit for bit
    ours, theirs = pack_ids(run_dir, 2), pack_ids(reference, 2)
    assert {step: ours[step] for step in after} == {step: theirs[step] for step in after}


def test_sigkill_during_a_save_keeps_the_previous_checkpoint_and_resume_is_bit_identical(
    reference: Path, tmp_path: Path
) -> None:
    """Killed after step 4, in the middle of its save (rank 1's data file written, rank 0's perhaps, no
    metadata, no marker): step-4 is skipped with a warning, step-2 loads, steps 3-6 match bit for bit."""
    run_dir = tmp_path / "run"
    args: list[str | Path] = ["train", DEBUG_CONFIG, "--nproc", "2", "--run-dir", run_dir]
    args += short_run(tmp_path / "cache")
    step_4 = run_dir / "checkpoints" / "step-4"
    # The save of step 4 stops for a minute after each rank's data file is written: the kill lands in it.
    env = environment(XTRAIN_TEST_PAUSE_IN_SAVE="4:60")
    job = start_xtrain(*args, cwd=tmp_path, log=tmp_path / "first.log", env=env)
    try:
        wait_until(lambda: len(list(step_4.glob("*.distcp"))) == 2, "both ranks' files of the save of step 4")
        assert complete(run_dir, 2)
        rank_process(job.pid, 1).send_signal(signal.SIGKILL)
        assert job.wait(timeout=120) != 0
    finally:
        job.kill()
    assert max(steps_logged(run_dir)) == 3  # step 4 trained, its save (before its record) interrupted
    assert not complete(run_dir, 4) and not (step_4 / ".metadata").exists()  # half-written, never marked

    stderr = _resume(run_dir, tmp_path)
    assert f"skipping {step_4}: incomplete checkpoint" in stderr
    assert f"resumed from {run_dir / 'checkpoints' / 'step-2'} at step 2" in stderr
    _assert_continues_exactly(run_dir, reference, resumed_from=2)
    assert complete(run_dir, 4) and complete(run_dir, 6)  # the resumed run saved them again, whole
    assert not (run_dir / "checkpoints" / "step-2").exists() or complete(run_dir, 2)
