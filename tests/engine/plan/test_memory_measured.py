"""The planner's tensor peak (xtrain.plan.memory, through plan_for on the cpu device) is at most 5 % below and at
most 10 % above the peak ``trace.memory`` measures in real runs of ``xtrain train`` (2 gloo processes, fp32, the
default MoE path: the fused CPU one). Below is the direction that makes a run that was planned to fit run out of
memory; above, the measured peak itself moves between runs of one configuration by up to 8 % on this machine
(cpu-moe: 168.5 to 181.6 MB with the same seed; not pinned down, the timing of gloo's background work the likely
cause; the plan takes the high case), so a 5 % bound both ways would fail by chance. On three configurations of
tools/bench/plan_accuracy.py's grid: the debug MoE with two micro-batches per rank (the gradients accumulated
from the first are live in the second's backward), with full checkpointing on 2k-token packs, and the larger
cpu-moe with full checkpointing on 2k-token packs (the whole grid's figures: docs/plan.md, "Agreement with
measurement"). A change to what the trainer keeps alive during a step fails here until the
memory model (and docs/plan.md, "The memory model") follows.

The plan describes a steady-state step, one that starts with AdamW's moments allocated: step 2 of each run is
compared (step 1 creates the moments inside its update and peaks lower).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from xtrain.plan.devices import device
from xtrain.plan.planner import plan_for
from xtrain.train.build import resolve_model_config
from xtrain.train.launch import check_world_size

from tests.engine.plan.measured_run import measured_overrides, train_measured

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

UNDER = 0.05
"""How far below the measured peak the plan may be."""
OVER = 0.10
"""How far above (the measurement's spread between runs)."""

RUNS = {
    "debug-2p-none-512-2micro": ("data.pack_tokens=512", "train.global_batch=4"),
    "debug-2p-full-2048": ("data.pack_tokens=2048", "train.global_batch=2", 'memory.checkpointing="full"'),
    "cpu-moe-2p-full-2048": (
        'model.size="cpu-moe"', "data.pack_tokens=2048", "train.global_batch=2", 'memory.checkpointing="full"'
    ),
}  # fmt: skip
"""name -> overrides of the debug run (2 processes on one node)."""


@pytest.mark.parametrize("name", sorted(RUNS))
def test_planned_tensor_peak_is_close_to_the_measured(name: str, tmp_path: Path) -> None:
    config, records = train_measured(2, 2, measured_overrides(tmp_path / "cache", *RUNS[name]), tmp_path / "run")
    layout = check_world_size(config, 2, 2)
    plan = plan_for(config, resolve_model_config(config), layout, device("cpu"))
    errors = []
    for steps in records.values():
        (steady,) = [record.mem_tensor_peak_bytes for record in steps if record.step == 2]
        assert steady is not None
        errors.append((plan.tensor_peak_bytes - steady) / steady)
    print(f"{name}: planned {plan.tensor_peak_bytes} B, relative errors per rank {[round(e, 4) for e in errors]}")
    assert min(errors) >= -UNDER and max(errors) <= OVER, (name, plan.parts, errors)
