"""What ``--resume auto|PATH|none`` (and ``xtrain export RUN_DIR|CHECKPOINT``) point at.

A checkpoint counts only when its completion marker is there (see :mod:`.manifest`) and its files are what was
saved (:mod:`.integrity`): ``auto`` takes the newest complete one of the run directory that verifies and skips,
with a warning, any newer folder without a marker (a save that was interrupted) or whose files do not verify (it
is listed in ``corrupted``, for the caller to set aside). A path that is not a checkpoint, or an incomplete or
corrupted one, is a user error naming it (the file, for a corrupted one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deeptrace.rundir import layout

from xtrain.errors import CheckpointError
from xtrain.train.checkpoint.integrity import CorruptCheckpointError, check_structure, verify
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


def newest_complete(
    run_dir: Path, warn: Warn, *, verified: bool = True, corrupted: list[Path] | None = None
) -> ResumePoint | None:
    """The newest checkpoint of ``run_dir`` with a readable marker (and, ``verified``, files that verify); newer
    folders are skipped with a warning, and those that fail verification added to ``corrupted`` (None when there
    is no such checkpoint)."""
    for _step, folder in reversed(layout.checkpoint_step_folders(run_dir)):
        if not is_complete(folder):
            warn(f"skipping {folder}: incomplete checkpoint (its save was interrupted before the {MARKER} marker)")
            continue
        try:
            return ResumePoint(folder, _checked_manifest(folder, verified=verified))
        except CorruptCheckpointError as error:
            warn(f"skipping {error}; falling back to an older checkpoint")
            if corrupted is not None:
                corrupted.append(folder)
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
        point = newest_complete(path, warn, verified=False)
        if point is None:
            raise CheckpointError(f"{path} is a run directory without a complete checkpoint in {path / 'checkpoints'}")
        _verify(point.folder, point.manifest)  # its newest: a corrupted one is refused, not silently replaced
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


def _checked_manifest(folder: Path, *, verified: bool = True) -> Manifest:
    try:
        manifest = read_manifest(folder)
    except ManifestError as error:
        raise CheckpointError(str(error)) from None
    if not (folder / DCP_METADATA).is_file():
        raise CorruptCheckpointError(
            f"checkpoint {folder} is corrupted: its {MARKER} marker is there but {folder / DCP_METADATA} is not"
        )
    if verified:
        _verify(folder, manifest)
    return manifest


def _verify(folder: Path, manifest: Manifest) -> None:
    """Every file against the marker's checksums; a marker without them (format 1, 2): the files against the
    extents DCP's metadata reads (a missing or truncated file, not a changed byte)."""
    if manifest.files is not None:
        verify(folder, manifest.files)
    else:
        check_structure(folder, _dcp_extents(folder))


def _dcp_extents(folder: Path) -> dict[str, int]:
    """File name → the byte up to which DCP's metadata reads it."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader  # noqa: PLC0415 (torch: only here)

    try:
        metadata = FileSystemReader(folder).read_metadata()
    except Exception as error:
        raise CorruptCheckpointError(
            f"checkpoint {folder} is corrupted: {folder / DCP_METADATA} cannot be read ({type(error).__name__})"
        ) from None
    extents: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = int(info.offset) + int(info.length)
        extents[info.relative_path] = max(extents.get(info.relative_path, 0), end)
    return extents


def resolve_resume(resume: str, run_dir: Path, warn: Warn, corrupted: list[Path] | None = None) -> ResumePoint | None:
    """The checkpoint ``--resume`` names for a run in ``run_dir`` (None: start from step 0); with ``auto``, the
    newer complete checkpoints that fail verification are added to ``corrupted``."""
    has_run = layout.metrics_path(run_dir).exists()
    if resume == "none":
        if has_run:
            raise CheckpointError(
                f"run directory {run_dir} already holds a run (metrics.jsonl): --resume none starts over only in a "
                "new run directory; use --resume auto to continue this one, or choose another --run-dir"
            )
        return None
    if resume == "auto":
        point = newest_complete(run_dir, warn, corrupted=corrupted)
        if point is None and has_run:
            warn(f"{run_dir} holds a run but no complete checkpoint: starting over from step 0 (metrics.jsonl goes on)")
        return point
    try:
        return open_checkpoint(Path(resume), warn)
    except CheckpointError as error:
        raise CheckpointError(f"--resume: {error}") from None
