"""The planner's tensor peak (xtrain.plan.memory, through plan_for on the cpu device) is at most 5 % below the peak
``trace.memory`` measures in real runs of ``xtrain train`` (gloo processes, fp32, the default MoE path: the fused
CPU one), and at most 8 % above it (one step against the largest of several in tools/bench/plan_accuracy.py,
whose target is 5 % both ways). On four configurations of its grid and one beside it: the
debug MoE with two micro-batches per rank (the gradients accumulated from the first are live in the second's
backward), with full checkpointing on 2k-token packs, the larger cpu-moe with full checkpointing on 2k-token packs
on two processes and on one (where the step peaks in the dense first layer's backward, not the last layer's), and
debug with expert parallelism, each rank planned with the rows its experts received. A change to what the
trainer keeps alive during a step fails here until the memory model (and docs/plan.md, "The memory model")
follows. On two processes the measurement can keep a block that gloo's thread freed (``xtrain.loss.peak_memory``),
which only raises it: the plan's known error is below, not above.

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
"""How far below the measured peak the plan may be (the direction in which a run planned to fit runs out)."""
OVER = 0.08
"""How far above: one step is compared here, and a single step's peak is not the run's. debug with two
micro-batches measured 30.5 MiB at step 2 here and 31.4-31.6 MiB as the largest of steps 2-6 in plan_accuracy.py
(plan 32.2 MiB: 5.3 % against the one step, 2.5 % against the run)."""

RUNS = {
    "debug-2p-none-512-2micro": (2, ("data.pack_tokens=512", "train.global_batch=4")),
    "debug-2p-full-2048": (2, ("data.pack_tokens=2048", "train.global_batch=2", 'memory.checkpointing="full"')),
    "cpu-moe-2p-full-2048": (
        2, ('model.size="cpu-moe"', "data.pack_tokens=2048", "train.global_batch=2", 'memory.checkpointing="full"')
    ),
    # One process: no gloo thread; the step peaks in the dense first layer's MLP backward, below the last layer.
    "cpu-moe-1p-full-2048": (
        1, ('model.size="cpu-moe"', "data.pack_tokens=2048", "train.global_batch=1", 'memory.checkpointing="full"')
    ),
}  # fmt: skip
"""name -> (processes, all on one node; overrides of the debug run)."""


@pytest.mark.parametrize("name", sorted(RUNS))
def test_planned_tensor_peak_is_close_to_the_measured(name: str, tmp_path: Path) -> None:
    processes, overrides = RUNS[name]
    config, records = train_measured(
        processes, processes, measured_overrides(tmp_path / "cache", *overrides), tmp_path / "run"
    )
    layout = check_world_size(config, processes, processes)
    plan = plan_for(config, resolve_model_config(config), layout, device("cpu"))
    errors = []
    for steps in records.values():
        (steady,) = [record.mem_tensor_peak_bytes for record in steps if record.step == 2]
        assert steady is not None
        errors.append((plan.tensor_peak_bytes - steady) / steady)
    print(f"{name}: planned {plan.tensor_peak_bytes} B, relative errors per rank {[round(e, 4) for e in errors]}")
    assert min(errors) >= -UNDER and max(errors) <= OVER, (name, plan.parts, errors)


def test_expert_parallel_ranks_are_planned_with_the_rows_they_received(tmp_path: Path) -> None:
    """Under expert parallelism ``trace.memory`` records the rows each rank's experts received per MoE layer; the
    ranks' receives add up to what they sent (T·K rows each, per layer), and the plan of each rank with its own
    rows is within the same bounds of its measured peak."""
    overrides = ("data.pack_tokens=512", "train.global_batch=2", "parallel.ep_size=2", "train.max_steps=3")
    config, records = train_measured(2, 2, measured_overrides(tmp_path / "cache", *overrides), tmp_path / "run")
    model = resolve_model_config(config)
    assert model.moe is not None
    moe_layers = sum(model.is_moe_layer(i) for i in range(model.num_layers))
    for step in (1, 2, 3):
        of_step = [next(r for r in steps if r.step == step) for steps in records.values()]
        rows = [record.expert_rows for record in of_step]
        assert all(r is not None and len(r) == moe_layers for r in rows), rows
        sent = sum(record.tokens or 0 for record in of_step) * model.moe.num_experts_per_tok
        assert [sum(layer) for layer in zip(*rows, strict=True)] == [sent] * moe_layers
    layout = check_world_size(config, 2, 2)
    errors = []
    for steps in records.values():
        (steady,) = [record for record in steps if record.step == 2]
        assert steady.mem_tensor_peak_bytes is not None
        plan = plan_for(config, model, layout, device("cpu"), expert_rows=steady.expert_rows)
        errors.append((plan.tensor_peak_bytes - steady.mem_tensor_peak_bytes) / steady.mem_tensor_peak_bytes)
    print(f"ep 2: relative errors per rank {[round(e, 4) for e in errors]}")
    assert min(errors) >= -UNDER and max(errors) <= OVER, errors
