"""Resuming from something that is not a usable checkpoint, through the real command line: one message naming
the checkpoint and the first mismatch, exit code 2, no traceback, nothing in the run directory touched."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tests.engine.checkpoint.cli_runs import DEBUG_CONFIG, xtrain
from tests.engine.checkpoint.conftest import short_settings
from tests.engine.train.test_cli_errors import assert_user_error

pytestmark = pytest.mark.slow


def _snapshot(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def _resume(run_dir: Path, resume: str | Path, cwd: Path, *overrides: str, nproc: bool = True) -> list[str]:
    args = ["train", str(DEBUG_CONFIG), "--run-dir", str(run_dir), "--resume", str(resume)]
    return [*args, *(["--nproc", "2"] if nproc else []), *short_settings(cwd / "cache", *overrides)]


@pytest.fixture
def copy_of_run(finished_run: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    return run_dir


def test_a_folder_that_is_not_a_checkpoint(copy_of_run: Path, tmp_path: Path) -> None:
    before = _snapshot(copy_of_run)
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "notes.txt").write_text("hello")
    for target, needle in [
        (tmp_path / "stuff", "is not a checkpoint"),
        (tmp_path / "stuff" / "notes.txt", "is not a checkpoint"),
        (tmp_path / "absent", "does not exist"),
    ]:
        result = xtrain(*_resume(copy_of_run, target, tmp_path), cwd=tmp_path)
        assert_user_error(result, str(target), needle)
    assert _snapshot(copy_of_run) == before


@pytest.mark.parametrize("nproc", [True, False], ids=["launcher", "in-the-rank"])
def test_an_incomplete_checkpoint(copy_of_run: Path, tmp_path: Path, nproc: bool) -> None:
    # The checkpoint of step 2 without its marker: what a save killed before the end leaves.
    incomplete = copy_of_run / "checkpoints" / "step-2"
    (incomplete / "COMPLETE").unlink()
    before = _snapshot(copy_of_run)
    result = xtrain(*_resume(copy_of_run, incomplete, tmp_path, nproc=nproc), cwd=tmp_path)
    assert_user_error(result, str(incomplete), "incomplete checkpoint", "no COMPLETE marker")
    assert _snapshot(copy_of_run) == before


def test_a_checkpoint_of_another_model_names_the_first_mismatched_key(finished_run: Path, tmp_path: Path) -> None:
    checkpoint = finished_run / "checkpoints" / "step-2"
    before = _snapshot(finished_run)
    # The dense debug model lacks the experts: layer 1's MLP is a key the checkpoint does not have.
    result = xtrain(*_resume(tmp_path / "new", checkpoint, tmp_path, 'model.size="debug-dense"'), cwd=tmp_path)
    assert_user_error(
        result,
        f"checkpoint {checkpoint} is of another model",
        "'layers.1.mlp.gate_proj.weight' is not in the checkpoint",
    )
    assert not (tmp_path / "new").exists()

    # The same shapes but a narrower dense MLP (a Hugging Face folder whose config.json says so).
    narrower = tmp_path / "narrower"
    shutil.copytree(finished_run / "hf" / "step-2", narrower)
    config = json.loads((narrower / "config.json").read_text())
    config["intermediate_size"] = 256
    (narrower / "config.json").write_text(json.dumps(config))
    text = DEBUG_CONFIG.read_text().replace('size = "debug"', f'hf_path = "{narrower}"')
    text = text.replace('"../tools/', f'"{DEBUG_CONFIG.parent.parent}/tools/').replace(
        '"tokenizer"', f'"{DEBUG_CONFIG.parent}/tokenizer"'
    )
    hf_config = tmp_path / "from_hf.toml"
    hf_config.write_text(text)
    args = _resume(tmp_path / "new", checkpoint, tmp_path)
    args[1] = str(hf_config)
    result = xtrain(*args, cwd=tmp_path)
    assert_user_error(
        result,
        f"checkpoint {checkpoint} is of another model",
        "'layers.0.mlp.gate_proj.weight' has shape [384, 128] in the checkpoint, [256, 128] in this model",
    )
    assert _snapshot(finished_run) == before and not (tmp_path / "new").exists()


def test_resume_none_never_starts_over_on_top_of_a_run(copy_of_run: Path, tmp_path: Path) -> None:
    before = _snapshot(copy_of_run)
    result = xtrain(*_resume(copy_of_run, "none", tmp_path), cwd=tmp_path)
    assert_user_error(result, str(copy_of_run), "already holds a run", "--resume auto")
    assert _snapshot(copy_of_run) == before
