"""The parallel layout is built and checked in one function, before any process group exists: the named
dimensions of every shape that can run, and one message naming the values for every shape that cannot."""

from __future__ import annotations

import pytest
from xtrain.config import ParallelSection
from xtrain.errors import ConfigError
from xtrain.parallel.layout import ParallelLayout, check_layout

Job = tuple[int, int, int | None]  # processes, processes per node, experts per MoE layer (None: dense)


@pytest.mark.parametrize(
    ("job", "replicate", "ep_size", "message"),
    [
        ((4, 4, 8), 1, 3, "parallel.ep_size = 3 with 4 processes (4 per node) and 8 experts: ep_size must divide the "
         "number of processes"),
        ((8, 2, 8), 1, 4, "parallel.ep_size = 4 with 8 processes (2 per node) and 8 experts: ep_size must divide the "
         "processes per node"),
        ((4, 4, 6), 1, 4, "parallel.ep_size = 4 with 4 processes (4 per node) and 6 experts: ep_size must divide the "
         "number of experts"),
        ((2, 2, None), 1, 2, "the model has no MoE layer"),
        ((2, 2, 8), 1, 0, "parallel.ep_size = 0 must be at least 1"),
        ((4, 4, 8), 3, 1, "parallel.replicate = 3 must divide the number of processes (4)"),
        ((4, 4, 8), 2, 4, "parallel.ep_size = 4 with parallel.replicate = 2, 4 processes (4 per node) and 8 experts: "
         "replicate * ep_size = 8 must divide the number of processes"),
        ((16, 4, 8), 2, 8, "parallel.ep_size = 8 with parallel.replicate = 2, 16 processes (4 per node) and 8 "
         "experts: ep_size must divide the processes per node"),
    ],
)  # fmt: skip
def test_bad_layouts_are_refused_naming_the_values(job: Job, replicate: int, ep_size: int, message: str) -> None:
    # model_construct: the check also guards values the config's own validation would refuse (ep_size 0).
    parallel = ParallelSection.model_construct(replicate=replicate, ep_size=ep_size)
    with pytest.raises(ConfigError) as error:
        check_layout(parallel, *job)
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("job", "replicate", "ep_size", "layout"),
    [
        ((4, 4, 8), 1, 1, ParallelLayout(replicate=1, shard=4, ep=1, processes_per_node=4)),  # plain FSDP
        ((4, 4, None), 2, 1, ParallelLayout(replicate=2, shard=2, ep=1, processes_per_node=4)),  # HSDP, dense model
        ((4, 4, 8), 1, 4, ParallelLayout(replicate=1, shard=1, ep=4, processes_per_node=4)),
        ((8, 4, 8), 1, 2, ParallelLayout(replicate=1, shard=4, ep=2, processes_per_node=4)),
        ((4, 4, 8), 2, 2, ParallelLayout(replicate=2, shard=1, ep=2, processes_per_node=4)),  # EP inside replicas
        # Two nodes of eight, one replica each, experts split over the eight GPUs of a node, fsdp 1.
        ((16, 8, 64), 2, 8, ParallelLayout(replicate=2, shard=1, ep=8, processes_per_node=8)),
        ((32, 8, 64), 2, 8, ParallelLayout(replicate=2, shard=2, ep=8, processes_per_node=8)),
    ],
)  # fmt: skip
def test_good_layouts_give_their_dimensions(job: Job, replicate: int, ep_size: int, layout: ParallelLayout) -> None:
    got = check_layout(ParallelSection(replicate=replicate, ep_size=ep_size), *job)
    assert got == layout
    assert got.world_size == job[0]
    assert got.dense_shard == job[0] // replicate
    assert got.expert_parallel == (ep_size > 1)


def test_processes_per_node_defaults_to_one_node() -> None:
    assert check_layout(ParallelSection(ep_size=4), 4, num_experts=8).processes_per_node == 4
    with pytest.raises(ConfigError, match="ep_size must divide the number of processes"):
        check_layout(ParallelSection(ep_size=4), 2, num_experts=8)


def test_replicate_with_ep_size_is_valid_config() -> None:
    # Once refused by the config's own validation; now a layout (experts split inside each replica).
    assert ParallelSection(replicate=2, ep_size=2).ep_size == 2
