"""Session fixtures: the results of one expert-parallel job per world size (jobs.py). The tests reading a job carry
its xdist group, so that under ``--dist loadgroup`` one worker runs them all and the job is spawned once."""

from __future__ import annotations

from typing import Any

import pytest

from ..parallel.ranks import run_ranks
from .jobs import four_rank_job, two_rank_job


@pytest.fixture(scope="session")
def ep_two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(2, two_rank_job, tmp_dir=tmp_path_factory.mktemp("ep-two-ranks"))


@pytest.fixture(scope="session")
def ep_four_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(4, four_rank_job, tmp_dir=tmp_path_factory.mktemp("ep-four-ranks"))
