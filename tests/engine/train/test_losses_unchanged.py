"""The trainer rebuilt from components (issue 20) trains exactly as the code before it: the losses, router
losses, gradient norms, learning rates and token counts of examples/debug_moe.toml on 2 processes for 10 steps —
as it is, with ``parallel.ep_size = 2``, and with full checkpointing + offload — equal, bit for bit, those the old
trainer recorded (fixtures/losses_before_trainer_components.json, written by loss_fixtures.py at the commit it
names). Bit for bit on a CPU of a kind that runs of that commit were recorded on (the machines file); elsewhere to
a relative 1e-4, since BLAS kernels round by instruction set (loss_fixtures.py says more)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.engine.train.loss_fixtures import (
    FIXTURE,
    SETTINGS,
    STEPS,
    machine_signature,
    recorded_for_this_machine,
    run_setting,
)

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_losses_equal_those_before_the_trainer_was_rebuilt(name: str, tmp_path: Path) -> None:
    recorded = json.loads(FIXTURE.read_text())
    assert recorded["steps"] == STEPS
    expected = recorded["runs"][name]
    assert len(expected) == STEPS
    runs = run_setting(name, tmp_path)
    this_machine = recorded_for_this_machine()
    if this_machine is not None:
        assert runs == this_machine[name]
        return
    for step, (got, want) in enumerate(zip(runs, expected, strict=True), start=1):
        assert got == pytest.approx(want, rel=1e-4), f"step {step} on {machine_signature()} (no exact fixture)"
