"""Fixtures shared by the training tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.train.eval_runs import evaluated_run_dir


@pytest.fixture(scope="session")
def evaluated_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One evaluated run for test_eval and test_samples (both in the xdist group "eval-run": one worker, one run)."""
    return evaluated_run_dir(tmp_path_factory.mktemp("eval"))
