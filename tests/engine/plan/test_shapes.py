"""The planner's FSDP groups are the trainer's: the same groups, and for each the padded shard FSDP2 gives a rank,
under plain FSDP, HSDP, expert parallelism and both (4 real processes). When apply_fsdp's grouping, sharding
or padding changes, this fails until the planner follows."""

from __future__ import annotations

from pathlib import Path

import pytest
from xtrain.config import ParallelSection
from xtrain.model.sizes import model_config
from xtrain.parallel.layout import check_layout
from xtrain.plan.shapes import fsdp_groups

from tests.engine.parallel.ranks import run_ranks
from tests.engine.plan.shape_job import LAYOUTS, padded_group_sizes

pytestmark = pytest.mark.slow


def test_groups_and_padded_shards_match_fsdp2(tmp_path: Path) -> None:
    ranks = run_ranks(4, padded_group_sizes, tmp_dir=tmp_path)
    model = model_config("debug").model_copy(update={"vocab_size": 510})
    for index, settings in enumerate(LAYOUTS):
        layout = check_layout(ParallelSection(**settings), 4, 4, 8)
        planned = {group.name: group.shard_numel for group in fsdp_groups(model, layout)}
        for rank, measured in enumerate(ranks):
            assert planned == measured[index], (settings, rank)
