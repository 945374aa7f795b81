"""The trainer rebuilt from components (issue 20) trains exactly as the code before it: the losses, router
losses, gradient norms, learning rates and token counts of examples/debug_moe.toml on 2 processes for 10 steps —
as it is, with ``parallel.ep_size = 2``, and with full checkpointing + offload — equal, bit for bit, those the old
trainer recorded (fixtures/losses_before_trainer_components.json, written by loss_fixtures.py at the commit it
names)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.engine.train.loss_fixtures import FIXTURE, SETTINGS, STEPS, run_setting

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_losses_equal_those_before_the_trainer_was_rebuilt(name: str, tmp_path: Path) -> None:
    recorded = json.loads(FIXTURE.read_text())
    assert recorded["steps"] == STEPS
    expected = recorded["runs"][name]
    assert len(expected) == STEPS
    assert run_setting(name, tmp_path) == expected
