"""A checkpoint written before the trainer was made of components (marker format version 1, its training state
an untyped dict) resumes exactly; a marker of a version this code does not read is refused, naming the version.

The old checkpoint is made here from a new one: same DCP files (their keys did not change), and the marker
rewritten into version 1's shape — checked against a marker the old code wrote
(tests/engine/train/fixtures/checkpoint_marker_v1.json), so the fixture cannot drift from the real old format.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.engine.checkpoint.cli_runs import DEBUG_CONFIG, EXACT_KEYS, latest_per_step, metrics, short_run, xtrain

pytestmark = pytest.mark.slow

OLD_MARKER = Path(__file__).parents[1] / "train" / "fixtures" / "checkpoint_marker_v1.json"


def as_version_1(marker: dict[str, Any]) -> dict[str, Any]:
    """A format-2 marker as the code before format 2 wrote it."""
    state = marker["train_state"]
    old_state = {
        "scheduler": state["schedule"],
        "data": state["data"],
        "skipped_steps": state["counters"]["skipped_steps"],
        "skipped_in_a_row": state["counters"]["skipped_in_a_row"],
    }
    return {**marker, "format_version": 1, "train_state": old_state}


def test_the_fixture_has_the_old_markers_shape(tmp_path: Path) -> None:
    old = json.loads(OLD_MARKER.read_text())
    assert old["format_version"] == 1
    new_style = {
        **old,
        "format_version": 2,
        "train_state": {
            "schedule": old["train_state"]["scheduler"],
            "data": old["train_state"]["data"],
            "counters": {"skipped_steps": 0, "skipped_in_a_row": 0},
        },
    }
    converted = as_version_1(new_style)
    assert set(converted) == set(old)
    assert set(converted["train_state"]) == set(old["train_state"])
    assert converted["train_state"]["scheduler"] == old["train_state"]["scheduler"]


def _run(root: Path, name: str, *extra: str) -> tuple[Path, str]:
    run_dir = root / name
    done = xtrain("train", DEBUG_CONFIG, "--run-dir", run_dir, *short_run(root / "cache"), *extra, cwd=root)
    return run_dir, done.stdout + done.stderr + f"\n(exit {done.returncode})"


def test_a_version_1_checkpoint_resumes_exactly_and_an_unknown_version_is_refused(tmp_path: Path) -> None:
    whole, said = _run(tmp_path, "whole")
    assert "(exit 0)" in said, said
    # The same run stopped after the checkpoint of step 2, its marker turned into format version 1.
    old, said = _run(tmp_path, "old", "--set", "train.max_steps=2")
    assert "(exit 0)" in said, said
    marker_path = old / "checkpoints" / "step-2" / "COMPLETE"
    marker = json.loads(marker_path.read_text())
    assert marker["format_version"] == 3
    marker_path.write_text(json.dumps(as_version_1(marker)))
    refused = tmp_path / "refused"
    shutil.copytree(old, refused)

    resumed, said = _run(tmp_path, "old")
    assert "(exit 0)" in said, said
    assert "resumed from" in said
    expected = latest_per_step(metrics(whole))
    got = latest_per_step(metrics(resumed))
    assert sorted(got) == sorted(expected)
    for step in range(3, 7):
        assert {key: got[step][key] for key in EXACT_KEYS} == {key: expected[step][key] for key in EXACT_KEYS}

    bad_marker = refused / "checkpoints" / "step-2" / "COMPLETE"
    bad_marker.write_text(json.dumps({**as_version_1(marker), "format_version": 0}))
    before = sorted(path.name for path in refused.rglob("*"))
    done = xtrain("train", DEBUG_CONFIG, "--run-dir", refused, "--resume", str(refused / "checkpoints" / "step-2"),
                  *short_run(tmp_path / "cache"), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "format version 0" in done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(path.name for path in refused.rglob("*")) == before
