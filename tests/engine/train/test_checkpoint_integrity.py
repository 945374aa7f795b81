"""Checkpoint integrity: the marker lists every file's size and CRC32, and a checkpoint is verified before it is
loaded. A corrupted newest checkpoint (a truncated shard, a flipped byte, a missing file) makes ``--resume auto``
warn and fall back to the newest one that verifies, setting the corrupted one aside (nothing deleted); ``--resume
PATH`` and ``xtrain export`` refuse it with one message naming the file, exit code 2, nothing touched. A marker of
format 2 (no checksums) still resumes, after the structural check, which refuses a truncated shard."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.engine.checkpoint.cli_runs import DEBUG_CONFIG, metrics, short_run, xtrain
from tests.engine.train.test_cli_errors import assert_user_error

pytestmark = pytest.mark.slow

QUICK = ("eval.sources=[]", "eval.sample_prompts=[]", "trace.enabled=false", "data.pack_tokens=64")
SHARD = "__0_0.distcp"


def _settings(root: Path, *overrides: str) -> list[str]:
    return short_run(root / "cache", *QUICK, *overrides)


def _snapshot(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One process, 4 steps, complete checkpoints at steps 2 and 4."""
    root = tmp_path_factory.mktemp("integrity")
    run_dir = root / "run"
    done = xtrain("train", DEBUG_CONFIG, "--run-dir", run_dir, *_settings(root, "train.max_steps=4"), cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    return run_dir


def test_the_marker_lists_every_file_with_its_checksum(saved_run: Path) -> None:
    folder = saved_run / "checkpoints" / "step-4"
    marker = json.loads((folder / "COMPLETE").read_text())
    assert marker["format_version"] == 3
    on_disk = {path.name for path in folder.iterdir() if path.name != "COMPLETE"}
    assert set(marker["files"]) == on_disk == {SHARD, ".metadata", "config.toml"}  # the ranks' digests are gone
    assert marker["files"][SHARD]["bytes"] == (folder / SHARD).stat().st_size


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated": (_truncate, "(truncated)"),
    "flipped": (_flip, "differs from what was saved"),
    "missing": (Path.unlink, "is missing"),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_a_corrupted_newest_checkpoint_is_refused_by_path_and_export_and_skipped_by_auto(
    saved_run: Path, tmp_path: Path, kind: str
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(saved_run, run_dir)
    step_4 = run_dir / "checkpoints" / "step-4"
    corrupt, needle = CORRUPTIONS[kind]
    corrupt(step_4 / SHARD)
    before = _snapshot(run_dir)

    refused = xtrain("train", DEBUG_CONFIG, "--nproc", "2", "--run-dir", run_dir, "--resume", step_4,
                     *_settings(tmp_path, "train.max_steps=6"), cwd=tmp_path)  # fmt: skip
    assert_user_error(refused, f"checkpoint {step_4} is corrupted", str(step_4 / SHARD), needle)
    for source in (step_4, run_dir):  # the folder, or the run directory whose newest it is
        exported = xtrain("export", source, tmp_path / "hf", cwd=tmp_path)
        assert_user_error(exported, str(step_4 / SHARD), needle)
    assert not (tmp_path / "hf").exists()
    assert _snapshot(run_dir) == before

    resumed = xtrain("train", DEBUG_CONFIG, "--run-dir", run_dir, "--resume", "auto",
                     *_settings(tmp_path, "train.max_steps=6"), cwd=tmp_path)  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"skipping checkpoint {step_4} is corrupted: {step_4 / SHARD}" in resumed.stderr
    assert f"resumed from {run_dir / 'checkpoints' / 'step-2'} at step 2" in resumed.stderr
    assert [r["resumed_from_step"] for r in metrics(run_dir) if "resumed_from_step" in r] == [2]
    set_aside = run_dir / "checkpoints" / "corrupt-step-4"
    assert _snapshot(set_aside) == {
        name.removeprefix("checkpoints/step-4/"): digest
        for name, digest in before.items()
        if name.startswith("checkpoints/step-4/")
    }  # every file of the corrupted checkpoint kept, as it was
    assert (step_4 / "COMPLETE").is_file()  # saved again by the resumed run, whole


def test_a_checkpoint_without_checksums_resumes_and_a_truncated_one_is_refused(saved_run: Path, tmp_path: Path) -> None:
    """Decided: a marker of format 1 or 2 (written before checksums) is loaded after a structural check (every
    file DCP's metadata reads exists and is long enough) and a warning-free resume; a changed byte there goes
    unseen, a truncated or missing file does not."""
    run_dir = tmp_path / "run"
    shutil.copytree(saved_run, run_dir)
    for step in (2, 4):
        marker_path = run_dir / "checkpoints" / f"step-{step}" / "COMPLETE"
        marker = json.loads(marker_path.read_text())
        del marker["files"]
        marker_path.write_text(json.dumps({**marker, "format_version": 2}))
    step_4 = run_dir / "checkpoints" / "step-4"
    _truncate(step_4 / SHARD)
    refused = xtrain("train", DEBUG_CONFIG, "--run-dir", run_dir, "--resume", step_4,
                     *_settings(tmp_path, "train.max_steps=6"), cwd=tmp_path)  # fmt: skip
    assert_user_error(refused, str(step_4 / SHARD), "(truncated)")
    step_2 = run_dir / "checkpoints" / "step-2"
    resumed = xtrain("train", DEBUG_CONFIG, "--run-dir", run_dir, "--resume", step_2,
                     *_settings(tmp_path, "train.max_steps=6"), cwd=tmp_path)  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from {step_2} at step 2" in resumed.stderr
