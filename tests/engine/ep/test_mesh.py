"""The expert-parallel layout is checked before any process group exists, with one message naming the values."""

from __future__ import annotations

import pytest
from xtrain.errors import ConfigError
from xtrain.parallel.mesh import check_expert_parallel


@pytest.mark.parametrize(
    ("world", "per_node", "experts", "ep_size", "message"),
    [
        (4, 4, 8, 3, "parallel.ep_size = 3 with 4 processes (4 per node) and 8 experts: ep_size must divide the "
         "number of processes"),
        (8, 2, 8, 4, "parallel.ep_size = 4 with 8 processes (2 per node) and 8 experts: ep_size must divide the "
         "processes per node"),
        (4, 4, 6, 4, "parallel.ep_size = 4 with 4 processes (4 per node) and 6 experts: ep_size must divide the "
         "number of experts"),
        (2, 2, None, 2, "the model has no MoE layer"),
        (2, 2, 8, 0, "parallel.ep_size = 0 must be at least 1"),
    ],
)  # fmt: skip
def test_bad_layouts_are_refused_naming_the_values(
    world: int, per_node: int, experts: int | None, ep_size: int, message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        check_expert_parallel(world, per_node, experts, ep_size)
    assert message in str(error.value)


def test_ep_with_hsdp_replicas_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"does not combine with parallel\.replicate = 2"):
        check_expert_parallel(8, 8, 8, 2, replicate=2)


@pytest.mark.parametrize(("world", "per_node", "experts", "ep_size"), [(4, 4, 8, 4), (8, 4, 8, 2), (2, 2, None, 1)])
def test_good_layouts_pass(world: int, per_node: int, experts: int | None, ep_size: int) -> None:
    check_expert_parallel(world, per_node, experts, ep_size)
