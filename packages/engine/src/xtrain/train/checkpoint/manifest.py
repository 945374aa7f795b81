"""The completion marker of a checkpoint, ``checkpoints/step-N/COMPLETE``: a small JSON file written last.

It is written by rank 0 only after every rank's DCP files are on disk (DCP's coordinator writes ``.metadata``
once it has gathered every rank's write results, and ``FileSystemWriter`` fsyncs each file), with an atomic
rename, so a folder either carries a readable marker or is incomplete. Besides marking, it holds what is the same
on every rank and small — the step, the training state that is not a tensor (:class:`.train_state.TrainState`:
LR schedule, data position, counters) and the resolved config — so a reader needs no torch to know what a
checkpoint is.

Format versions: 1 held the training state as an untyped dict (read and converted, so those checkpoints resume
exactly); 2 holds a ``TrainState``; 3 adds ``files``, the size and CRC32 of every other file of the checkpoint
(:mod:`.integrity`), verified before the checkpoint is loaded. Versions 1 and 2 have no checksums and resume after
a structural check only. A newer version than this code knows is refused with a message naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterx.fileio import write_atomically
from deeptrace.rundir import layout
from pydantic import ValidationError

from xtrain.train.checkpoint.integrity import FileDigest
from xtrain.train.checkpoint.train_state import TrainState

FORMAT = "xtrain-checkpoint"
FORMAT_VERSION = 3
FIRST_VERSION_WITH_CHECKSUMS = 3
OLDEST_FORMAT_VERSION = 1
MARKER = layout.CHECKPOINT_COMPLETE_MARKER
CONFIG_FILE = "config.toml"
"""The resolved config beside the DCP files, for people (the marker holds the same text)."""


@dataclass(frozen=True)
class Manifest:
    step: int
    """Optimizer steps taken when the state was saved."""
    world_size: int
    replicate: int
    """HSDP replicate degree of the saving run (informational: DCP reshards to any mesh)."""
    train_state: TrainState
    config_toml: str
    model_config: dict[str, Any]
    """The model's shapes (``ModelConfig``), so an export needs neither the config's files nor a Hugging Face
    folder it started from."""
    xtrain_version: str
    saved_unix_s: float
    files: dict[str, FileDigest] | None = None
    """Every other file of the checkpoint (relative name → size and CRC32); None in a marker of format 1 or 2."""
    format_version: int = FORMAT_VERSION
    """The version the marker was written in (older ones are converted when read)."""

    def to_json(self) -> str:
        if self.files is None:
            raise ValueError("a checkpoint marker is written with the checksums of its files")
        fields = {name: getattr(self, name) for name in _FIELDS if name != "train_state"}
        document = {"format": FORMAT, **fields, "format_version": FORMAT_VERSION}
        document["train_state"] = self.train_state.model_dump(mode="json")
        document["files"] = {name: digest.to_json() for name, digest in self.files.items()}
        return json.dumps(document, indent=1) + "\n"


_FIELDS = ("step", "world_size", "replicate", "train_state", "config_toml", "model_config", "xtrain_version",
           "saved_unix_s")  # fmt: skip


class ManifestError(ValueError):
    """The marker exists but cannot be read as one (the message says what is wrong)."""


def read_manifest(folder: Path) -> Manifest:
    path = folder / MARKER
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ManifestError(f"{path} is not a readable completion marker ({error})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ManifestError(f"{path} is not an xtrain checkpoint marker (no format {FORMAT!r})")
    version = raw.get("format_version")
    if not isinstance(version, int) or version < OLDEST_FORMAT_VERSION:
        raise ManifestError(
            f"{path} has checkpoint format version {version!r}, which this xtrain cannot read "
            f"(it reads versions {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION})"
        )
    if version > FORMAT_VERSION:
        raise ManifestError(
            f"{path} has checkpoint format version {version}: upgrade xtrain to read it "
            f"(this one reads versions {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION})"
        )
    try:
        fields = {key: raw[key] for key in _FIELDS}
        state = fields["train_state"]
        fields["train_state"] = TrainState.from_version_1(state) if version == 1 else TrainState.model_validate(state)
        files = None
        if version >= FIRST_VERSION_WITH_CHECKSUMS:
            files = {str(name): FileDigest.from_json(entry) for name, entry in dict(raw["files"]).items()}
    except KeyError as missing:
        raise ManifestError(f"{path} (format version {version}) lacks the field {missing}") from None
    except (ValidationError, TypeError) as error:
        raise ManifestError(f"{path} (format version {version}) has a bad train_state: {error}") from None
    except ValueError as error:
        raise ManifestError(f"{path} (format version {version}) has a bad list of files: {error}") from None
    return Manifest(**fields, files=files, format_version=version)


def write_manifest(folder: Path, manifest: Manifest) -> None:
    """Write the marker atomically (temporary file, fsync, rename, fsync of the folder): the last write of a save."""
    write_atomically(folder / MARKER, manifest.to_json(), fsync_folder=True)
