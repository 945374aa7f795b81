"""``xtrain.parallel`` exports the layout, the meshes and every technique, expert parallelism included."""

from __future__ import annotations

import pytest
from xtrain import parallel


def test_every_exported_name_resolves_to_its_module() -> None:
    homes = {name: getattr(parallel, name).__module__ for name in parallel.__all__}
    assert homes["ParallelLayout"] == homes["check_layout"] == "xtrain.parallel.layout"
    assert homes["model_meshes"] == "xtrain.parallel.mesh"
    assert homes["apply_expert_parallel"] == homes["ExpertParallelSchedule"] == "xtrain.parallel.expert_parallel"
    assert all(module.startswith("xtrain.parallel.") for module in homes.values()), homes


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_thing"):
        _ = parallel.no_such_thing  # type: ignore[attr-defined]  # the point of the test
