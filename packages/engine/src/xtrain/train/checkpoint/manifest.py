"""The completion marker of a checkpoint, ``checkpoints/step-N/COMPLETE``: a small JSON file written last.

It is written by rank 0 only after every rank's DCP files are on disk (DCP's coordinator writes ``.metadata``
once it has gathered every rank's write results, and ``FileSystemWriter`` fsyncs each file), with an atomic
rename, so a folder either carries a readable marker or is incomplete. Besides marking, it holds what is the same
on every rank and small — the step, the training state that is not a tensor (LR schedule, data position,
counters) and the resolved config — so a reader needs no torch to know what a checkpoint is.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from deeptrace.rundir import layout

FORMAT = "xtrain-checkpoint"
FORMAT_VERSION = 1
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
    train_state: dict[str, Any]
    """scheduler (LambdaLR state_dict), data (PackStream position), skipped_steps, skipped_in_a_row."""
    config_toml: str
    model_config: dict[str, Any]
    """The model's shapes (``ModelConfig``), so an export needs neither the config's files nor a Hugging Face
    folder it started from."""
    xtrain_version: str
    saved_unix_s: float

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION, **asdict(self)}, indent=1) + "\n"


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
    if raw.get("format_version", 0) > FORMAT_VERSION:
        raise ManifestError(f"{path} has format version {raw['format_version']}: upgrade xtrain to read it")
    try:
        return Manifest(**{key: raw[key] for key in Manifest.__dataclass_fields__})
    except KeyError as missing:
        raise ManifestError(f"{path} lacks the field {missing}") from None


def write_manifest(folder: Path, manifest: Manifest) -> None:
    """Write the marker atomically (temporary file, fsync, rename, fsync of the folder): the last write of a save."""
    temporary = folder / f".{MARKER}.{os.getpid()}.tmp"
    with temporary.open("w") as handle:
        handle.write(manifest.to_json())
        handle.flush()
        os.fsync(handle.fileno())
    temporary.replace(folder / MARKER)
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
