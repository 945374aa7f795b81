"""The memory plan under expert parallelism takes the rows a rank's experts receive per MoE layer (the routing):
uniform routing by default, more rows planned as more memory, and a row count per MoE layer or a clear error."""

from __future__ import annotations

import pytest
from xtrain.config import load_train_config
from xtrain.plan.devices import device
from xtrain.plan.planner import plan_for
from xtrain.train.build import resolve_model_config
from xtrain.train.launch import check_world_size

from tests.conftest import REPO_ROOT

OVERRIDES = ("data.pack_tokens=1024", "train.global_batch=2", "parallel.ep_size=2", 'parallel.mixed_precision="fp32"')


def _plan(*overrides: str, expert_rows: list[int] | None = None) -> int:
    config = load_train_config(REPO_ROOT / "examples" / "debug_moe.toml", OVERRIDES + overrides)
    model = resolve_model_config(config)
    layout = check_world_size(config, 2, 2)
    return plan_for(config, model, layout, device("cpu"), expert_rows=expert_rows).tensor_peak_bytes


def test_uniform_rows_are_the_default() -> None:
    uniform = 1024 * 2  # T·K rows per MoE layer (the debug model: 3 MoE layers, top-2)
    assert _plan(expert_rows=[uniform] * 3) == _plan()


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_a_rank_that_receives_more_rows_is_planned_larger(checkpointing: str) -> None:
    setting = f'memory.checkpointing="{checkpointing}"'
    balanced = _plan(setting, expert_rows=[2048, 2048, 2048])
    for hot in ([3072, 2048, 2048], [2048, 2048, 3072]):  # an early layer's saved set; the last's backward too
        assert _plan(setting, expert_rows=hot) > balanced
    assert _plan(setting, expert_rows=[1024, 2048, 2048]) < balanced


def test_one_row_count_per_moe_layer_or_a_clear_error() -> None:
    with pytest.raises(ValueError, match="expert_rows has 2 values for the model's 3 MoE layers"):
        _plan(expert_rows=[2048, 2048])
