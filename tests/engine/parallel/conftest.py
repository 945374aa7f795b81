"""Session fixtures: the reference checkpoints transformers writes, and the results of one sharded job per world
size (jobs.py). Tests that read a job's results carry its xdist group (compare.py), so that under
``--dist loadgroup`` one worker runs them all and the job is spawned once."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import Qwen3ForCausalLM, Qwen3MoeForCausalLM

from ..hf_reference import TinyModel, build_reference, save_reference
from .compare import References
from .jobs import HFFolders, four_rank_job, two_rank_job
from .ranks import run_ranks

# Six layers of eight experts: each tensor (at most a layer's fused experts, 128 KiB) is a small fraction of the
# model (1.4 MiB), so "one rank's share plus one tensor" and "the whole model" are far apart.
MOE_SHAPE = TinyModel(moe=True, num_layers=6, mlp_only_layers=(0,))
DENSE_SHAPE = TinyModel(moe=False, num_layers=4)


@pytest.fixture(scope="session")
def references(tmp_path_factory: pytest.TempPathFactory) -> References:
    root = tmp_path_factory.mktemp("parallel-hf")
    dense, moe = build_reference(DENSE_SHAPE, seed=21), build_reference(MOE_SHAPE, seed=22)
    assert isinstance(dense, Qwen3ForCausalLM) and isinstance(moe, Qwen3MoeForCausalLM)
    folders = HFFolders(
        dense=str(save_reference(dense, root / "dense")), moe=str(save_reference(moe, root / "moe")), out=str(root)
    )
    return References(folders, dense, moe)


@pytest.fixture(scope="session")
def two_ranks(references: References, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(2, two_rank_job, references.folders, tmp_dir=tmp_path_factory.mktemp("two-ranks"))


@pytest.fixture(scope="session")
def four_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(4, four_rank_job, tmp_dir=tmp_path_factory.mktemp("four-ranks"))
