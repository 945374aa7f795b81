"""``parallel.ep_size`` and ``parallel.replicate`` checked against the job by ``check_world_size`` (the launcher
before it starts processes, every rank under torchrun), with the expert count taken from the model the config
names."""

from __future__ import annotations

from pathlib import Path

import pytest
from xtrain.config import TrainConfig
from xtrain.errors import ConfigError
from xtrain.train.launch import check_world_size

from tests.engine.train.run_trainer import load


def _config(tmp_path: Path, *overrides: str) -> TrainConfig:
    return load((f"data.cache_dir={tmp_path}", "train.global_batch=8", *overrides))


@pytest.mark.parametrize(
    ("overrides", "world", "per_node", "message"),
    [
        (('model.size="debug-dense"', "parallel.ep_size=2"), 2, None, "and no experts: the model has no MoE layer"),
        (("parallel.ep_size=4",), 8, 2, "parallel.ep_size = 4 with 8 processes (2 per node) and 8 experts"),
        (("parallel.ep_size=2",), 1, None, "ep_size must divide the number of processes"),
        (("parallel.ep_size=2", "parallel.replicate=2"), 8, 1, "ep_size must divide the processes per node"),
    ],
    ids=["dense-model", "across-nodes", "one-process", "replicas-of-one-process-per-node"],
)
def test_layouts_that_cannot_run_are_refused(
    tmp_path: Path, overrides: tuple[str, ...], world: int, per_node: int | None, message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        check_world_size(_config(tmp_path, *overrides), world, per_node)
    assert message in str(error.value)


def test_layouts_that_fit_pass(tmp_path: Path) -> None:
    check_world_size(_config(tmp_path, "parallel.ep_size=4"), 8, 4)  # two nodes of four, experts split in each
    check_world_size(_config(tmp_path, 'model.size="debug-dense"'), 2)  # ep_size 1: nothing to check
    # Two nodes of two, a replica on each, experts split over the two processes of a node.
    layout = check_world_size(_config(tmp_path, "parallel.replicate=2", "parallel.ep_size=2"), 4, 2)
    assert (layout.replicate, layout.shard, layout.ep) == (2, 1, 2)
