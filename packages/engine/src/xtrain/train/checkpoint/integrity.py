"""Checksums of a checkpoint's files: recorded when it is saved, verified before it is loaded or exported.

Saving: each rank, right after DCP has written (and fsynced) its data files, reads them back and writes their
sizes and CRC32s into a small digest file beside them (``__R_xtrain-digests.json``); this runs in the rank's own
writer (the background thread of an asynchronous save), so the ranks hash their shares in parallel. Rank 0 then
adds DCP's ``.metadata`` and ``config.toml``, moves every digest into the completion marker (format 3: ``files``)
and removes the digest files before it writes the marker: a complete checkpoint lists every file it holds.

Verifying (:func:`verify`): every listed file must be there with its size and CRC32; the first that is not is
named — missing, truncated (or grown), or changed. CRC32 (zlib, about 2 GB/s per core on these machines, files
hashed on several threads) catches the faults it is meant for — a truncated shard, a flipped byte, a missing
file — not a deliberate forgery. A marker of an older format has no checksums: its checkpoint resumes after the
structural check alone (:func:`check_structure`: every file DCP's metadata points into exists and is long
enough), which catches a missing or truncated file but not a changed byte.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from clusterx.fileio import write_atomically

from xtrain.errors import CheckpointError

DIGESTS_SUFFIX = "xtrain-digests.json"
"""A rank's digest file, ``{DCP's file prefix}xtrain-digests.json``: present only while a save is in flight."""
_CHUNK_BYTES = 8 << 20
_THREADS = 8


class CorruptCheckpointError(CheckpointError):
    """A complete checkpoint whose files are not what was saved: the message names the file."""


@dataclass(frozen=True)
class FileDigest:
    size: int
    crc32: int

    def to_json(self) -> dict[str, int]:
        return {"bytes": self.size, "crc32": self.crc32}

    @classmethod
    def from_json(cls, raw: object) -> FileDigest:
        if not isinstance(raw, dict) or not isinstance(raw.get("bytes"), int) or not isinstance(raw.get("crc32"), int):
            raise ValueError(f"not a file digest: {raw!r}")
        return cls(size=raw["bytes"], crc32=raw["crc32"])


def digest_file(path: Path) -> FileDigest:
    crc, size = 0, 0
    buffer = bytearray(_CHUNK_BYTES)
    view = memoryview(buffer)
    with path.open("rb", buffering=0) as file:
        while read := file.readinto(buffer):
            crc = zlib.crc32(view[:read], crc)
            size += read
    return FileDigest(size, crc)


def digest_files(folder: Path, names: Iterable[str]) -> dict[str, FileDigest]:
    ordered = sorted(set(names))
    with ThreadPoolExecutor(max_workers=max(1, min(_THREADS, len(ordered)))) as pool:
        return dict(zip(ordered, pool.map(lambda name: digest_file(folder / name), ordered), strict=True))


def write_rank_digests(folder: Path, prefix: str, names: Iterable[str]) -> None:
    """In a rank, once its data files ``names`` are written: their digests, for rank 0 to collect."""
    digests = {name: digest.to_json() for name, digest in digest_files(folder, names).items()}
    write_atomically(folder / f"{prefix}{DIGESTS_SUFFIX}", json.dumps(digests))


def collect_digests(folder: Path, also: Iterable[str]) -> dict[str, FileDigest]:
    """On rank 0 after every rank's write: the ranks' digests, and those of the files ``also`` (DCP's metadata,
    the config), for the marker; the ranks' digest files are removed."""
    collected: dict[str, FileDigest] = {}
    sidecars = sorted(folder.glob(f"*{DIGESTS_SUFFIX}"))
    for sidecar in sidecars:
        raw = json.loads(sidecar.read_text())
        collected.update({name: FileDigest.from_json(entry) for name, entry in raw.items()})
    collected.update(digest_files(folder, also))
    for sidecar in sidecars:
        sidecar.unlink()
    return dict(sorted(collected.items()))


def verify(folder: Path, files: dict[str, FileDigest]) -> None:
    """CorruptCheckpointError naming the first file of ``folder`` that is missing, of another size, or changed."""
    for name, expected in files.items():
        path = folder / name
        if not path.is_file():
            raise CorruptCheckpointError(f"checkpoint {folder} is corrupted: {path} is missing")
        size = path.stat().st_size
        if size != expected.size:
            raise CorruptCheckpointError(
                f"checkpoint {folder} is corrupted: {path} has {size} bytes, {expected.size} when it was saved "
                f"({'truncated' if size < expected.size else 'grown'})"
            )
    found = digest_files(folder, files)
    for name, expected in files.items():
        if found[name].crc32 != expected.crc32:
            raise CorruptCheckpointError(
                f"checkpoint {folder} is corrupted: {folder / name} differs from what was saved (CRC32 "
                f"{found[name].crc32:08x}, {expected.crc32:08x} when saved)"
            )


def check_structure(folder: Path, extents: dict[str, int]) -> None:
    """Without checksums (a marker of an older format): CorruptCheckpointError when a file that DCP's metadata
    points into (``extents``: name → bytes it must at least hold) is missing or shorter."""
    for name, needed in sorted(extents.items()):
        path = folder / name
        if not path.is_file():
            raise CorruptCheckpointError(f"checkpoint {folder} is corrupted: {path} is missing")
        size = path.stat().st_size
        if size < needed:
            raise CorruptCheckpointError(
                f"checkpoint {folder} is corrupted: {path} has {size} bytes, DCP's metadata reads up to byte "
                f"{needed} (truncated)"
            )
