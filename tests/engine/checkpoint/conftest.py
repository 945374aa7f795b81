"""A small finished run with checkpoints, shared by the tests that only read it (bad input, export)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.checkpoint.cli_runs import DEBUG_CONFIG, xtrain


def short_settings(cache_dir: Path, *overrides: str) -> list[str]:
    settings = (
        "train.max_steps=2",
        "train.global_batch=2",
        "data.pack_tokens=64",
        f"data.cache_dir={cache_dir}",
        'parallel.mixed_precision="fp32"',
        "trace.profile_steps=[]",
        *overrides,
    )
    return [arg for setting in settings for arg in ("--set", setting)]


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One process, 2 steps, a checkpoint and a Hugging Face folder at step 2 (written by the background
    export that ``checkpoint.hf_every_steps`` starts)."""
    root = tmp_path_factory.mktemp("finished")
    run_dir = root / "run"
    overrides = ("checkpoint.every_steps=2", "checkpoint.hf_every_steps=2")
    result = xtrain("train", DEBUG_CONFIG, "--run-dir", run_dir, *short_settings(root / "cache", *overrides), cwd=root)
    assert result.returncode == 0, result.stdout + result.stderr
    return run_dir
