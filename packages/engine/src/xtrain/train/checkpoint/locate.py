"""What ``--resume auto|PATH|none`` (and ``xtrain export RUN_DIR|CHECKPOINT``) point at.

A checkpoint counts only when its completion marker is there (see :mod:`.manifest`): ``auto`` takes the newest
complete one of the run directory and skips, with a warning, any newer folder without a marker (a save that was
interrupted). A path that is not a checkpoint, or an incomplete one, is a user error naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deeptrace.rundir import layout

from xtrain.errors import CheckpointError
from xtrain.train.checkpoint.manifest import MARKER, Manifest, ManifestError, read_manifest

DCP_METADATA = ".metadata"
"""Written by DCP's coordinator once every rank's files are written."""

Warn = Callable[[str], None]


@dataclass(frozen=True)
class ResumePoint:
    folder: Path
    manifest: Manifest

    @property
    def step(self) -> int:
        return self.manifest.step


def is_complete(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def newest_complete(run_dir: Path, warn: Warn) -> ResumePoint | None:
    """The newest checkpoint of ``run_dir`` with a readable marker; newer folders without one are skipped with a
    warning (None when there is no complete checkpoint)."""
    for _step, folder in reversed(layout.checkpoint_step_folders(run_dir)):
        if not is_complete(folder):
            warn(f"skipping {folder}: incomplete checkpoint (its save was interrupted before the {MARKER} marker)")
            continue
        try:
            return ResumePoint(folder, _checked_manifest(folder))
        except CheckpointError as error:
            warn(f"skipping {folder}: {error}")
    return None


def open_checkpoint(path: Path, warn: Warn) -> ResumePoint:
    """A checkpoint folder (``RUN_DIR/checkpoints/step-N``), or a run directory (its newest complete checkpoint);
    CheckpointError naming the path when it is neither, or incomplete."""
    path = path.expanduser().resolve()
    if not path.exists():
        raise CheckpointError(f"{path} does not exist: pass RUN_DIR/checkpoints/step-N or a run directory")
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a checkpoint: a checkpoint is a folder RUN_DIR/checkpoints/step-N")
    if layout.checkpoints_dir(path).is_dir() and not (path / DCP_METADATA).exists():
        point = newest_complete(path, warn)
        if point is None:
            raise CheckpointError(f"{path} is a run directory without a complete checkpoint in {path / 'checkpoints'}")
        return point
    if not is_complete(path):
        if (path / DCP_METADATA).exists() or any(path.glob("*.distcp")):
            run_dir = path.parent.parent
            in_a_run = layout.checkpoint_step(path) is not None
            newest = newest_complete(run_dir, lambda message: None) if in_a_run else None
            hint = f"; the newest complete one there is {newest.folder}" if newest else ""
            raise CheckpointError(
                f"{path} is an incomplete checkpoint (no {MARKER} marker: its save was interrupted){hint}"
            )
        raise CheckpointError(
            f"{path} is not a checkpoint (no {MARKER} marker, no DCP files): pass RUN_DIR/checkpoints/step-N"
        )
    return ResumePoint(path, _checked_manifest(path))


def _checked_manifest(folder: Path) -> Manifest:
    try:
        manifest = read_manifest(folder)
    except ManifestError as error:
        raise CheckpointError(str(error)) from None
    if not (folder / DCP_METADATA).is_file():
        raise CheckpointError(f"{folder} is damaged: its {MARKER} marker is there but DCP's {DCP_METADATA} is not")
    return manifest


def resolve_resume(resume: str, run_dir: Path, warn: Warn) -> ResumePoint | None:
    """The checkpoint ``--resume`` names for a run in ``run_dir`` (None: start from step 0)."""
    has_run = layout.metrics_path(run_dir).exists()
    if resume == "none":
        if has_run:
            raise CheckpointError(
                f"run directory {run_dir} already holds a run (metrics.jsonl): --resume none starts over only in a "
                "new run directory; use --resume auto to continue this one, or choose another --run-dir"
            )
        return None
    if resume == "auto":
        point = newest_complete(run_dir, warn)
        if point is None and has_run:
            warn(f"{run_dir} holds a run but no complete checkpoint: starting over from step 0 (metrics.jsonl goes on)")
        return point
    try:
        return open_checkpoint(Path(resume), warn)
    except CheckpointError as error:
        raise CheckpointError(f"--resume: {error}") from None
