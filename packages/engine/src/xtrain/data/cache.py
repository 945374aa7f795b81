"""The on-disk token cache: one folder per (file content, tokenizer, kind), split into parts built independently.

Layout under the cache root (``DataConfig.resolved_cache_dir()``)::

    digests/<hash of the path>.json            content digest of a source file, valid while its stat stamp holds
    <file stem>-<key>/source.json              what the entry was built from (for people; not read back)
    <file stem>-<key>/part-00000/tokens.npy    uint32 [tokens]: the documents' ids back to back
    <file stem>-<key>/part-00000/offsets.npy   int64 [documents + 1]: document d is tokens[offsets[d]:offsets[d+1]]
    <file stem>-<key>/part-00000/loss_mask.npy uint8 [tokens], chat only: 1 where the token carries loss
    <file stem>-<key>/part-00000/meta.json     counts, byte range and the first bad lines with their reasons

``key`` hashes the cache format, the file's content digest (BLAKE2b of its bytes), the tokenizer folder's
fingerprint (tokenizer.json and tokenizer_config.json, which holds the chat template), the data kind and the part
size: a changed file, another tokenizer or template, or the other kind never reuses an entry. Part ``k`` holds
the lines whose first byte lies in ``[k * PART_BYTES, (k + 1) * PART_BYTES)``, so the parts depend on the file
alone, never on how many ranks built them. A part is written into a temporary folder and renamed into place:
it exists completely or not at all, and a killed build leaves only a ``*.tmp-*`` folder that nothing reads.
"""

import hashlib
import json
import math
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from clusterx.fileio import write_atomically

from xtrain.data.chat_template import RenderedChat
from xtrain.data.config import DataSource
from xtrain.data.documents import BadLineError, Document, DocumentEncoder
from xtrain.errors import DataError

CACHE_FORMAT = 1
PART_BYTES = 32 * 2**20
"""A source file is tokenised in parts of about this many bytes; each part is one unit of parallel work."""
BAD_LINES_KEPT = 20
"""How many bad lines (line and reason) each part records for the log; all of them are counted."""
RACY_MARGIN_NS = 2 * 10**9
"""A remembered file digest is trusted only for a file unchanged this long before it was hashed (see file_digest)."""
_ENCODE_BATCH = 512  # lines per call into the tokenizer (it parallelises a batch over its own threads)


def discover_files(source: DataSource) -> list[Path]:
    """The JSONL files of a source: the file itself, or a folder's ``*.jsonl`` (recursive, sorted)."""
    path = source.path
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(candidate for candidate in path.rglob("*.jsonl") if candidate.is_file())
        if not files:
            raise DataError(f"{path}: the data source folder holds no .jsonl file (data.sources)")
        return files
    raise DataError(f"{path}: the data source does not exist (data.sources)")


def file_digest(path: Path, cache_root: Path) -> str:
    """BLAKE2b of the file's bytes, remembered under ``digests/`` while the file's stat stamp stays the same.

    The stamp is size, mtime, ctime and inode (ctime changes on every write and rename, and no tool sets it back).
    A memo is trusted only when the file was last changed at least ``RACY_MARGIN_NS`` before it was hashed:
    file systems stamp times with a coarse clock, so a file rewritten within the same tick can keep its stamp.
    """
    stat = path.stat()
    stamp = [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]
    memo = cache_root / "digests" / f"{hashlib.blake2b(str(path).encode(), digest_size=12).hexdigest()}.json"
    try:
        known = json.loads(memo.read_text())
        last_change = max(stat.st_mtime_ns, stat.st_ctime_ns)
        if (
            known["path"] == str(path)
            and known["stamp"] == stamp
            and int(known["hashed_at_ns"]) - last_change >= RACY_MARGIN_NS
        ):
            return str(known["digest"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no memo yet, an unreadable or untrusted one: hash the file
    hashed_at_ns = time.time_ns()  # before reading: a write during the hash makes the memo untrusted
    digest = hashlib.blake2b(digest_size=20)
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 22):
            digest.update(chunk)
    record = {"path": str(path), "stamp": stamp, "hashed_at_ns": hashed_at_ns, "digest": digest.hexdigest()}
    memo.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(memo, json.dumps(record))
    return digest.hexdigest()


@dataclass(frozen=True)
class CachedFile:
    """One source file's cache entry."""

    path: Path
    size: int
    digest: str
    folder: Path

    @property
    def num_parts(self) -> int:
        return max(1, math.ceil(self.size / PART_BYTES))

    def part_folder(self, part: int) -> Path:
        return self.folder / f"part-{part:05d}"

    def has_part(self, part: int) -> bool:
        return (self.part_folder(part) / "meta.json").is_file()


def plan_file(
    path: Path, cache_root: Path, tokenizer_fingerprint: str, kind: Literal["pretrain", "chat"]
) -> CachedFile:
    """The cache entry of ``path`` (which may or may not exist yet)."""
    digest = file_digest(path, cache_root)
    key_source = json.dumps([CACHE_FORMAT, digest, tokenizer_fingerprint, kind, PART_BYTES])
    key = hashlib.blake2b(key_source.encode(), digest_size=12).hexdigest()
    return CachedFile(path=path, size=path.stat().st_size, digest=digest, folder=cache_root / f"{path.stem}-{key}")


def build_part(entry: CachedFile, part: int, encoder: DocumentEncoder, on_bytes: Callable[[int], None]) -> None:
    """Tokenise part ``part`` of ``entry.path`` into its cache folder (atomically; a racing writer's copy wins)."""
    start, end = _part_byte_range(entry, part)
    documents, bad_count, bad_lines = _tokenise_range(entry.path, start, end, encoder, on_bytes)
    lengths = np.asarray([len(document.ids) for document in documents], dtype=np.int64)
    offsets = np.zeros(len(documents) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.concatenate([d.ids for d in documents]) if documents else np.zeros(0, dtype=np.uint32)
    meta = {
        "format": CACHE_FORMAT,
        "file": str(entry.path),
        "digest": entry.digest,
        "part": part,
        "byte_range": [start, end],
        "documents": len(documents),
        "tokens": int(offsets[-1]),
        "skipped_lines": bad_count,
        "bad_lines": bad_lines,
    }
    entry.folder.mkdir(parents=True, exist_ok=True)
    if not (entry.folder / "source.json").exists():
        source = {"file": str(entry.path), "digest": entry.digest, "tokenizer": str(encoder.folder.path)}
        write_atomically(entry.folder / "source.json", json.dumps({**source, "kind": encoder.kind}))
    scratch = entry.folder / f"{entry.part_folder(part).name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    scratch.mkdir()
    try:
        _save_array(scratch / "tokens.npy", tokens)
        _save_array(scratch / "offsets.npy", offsets)
        if encoder.kind == "chat":
            masks = [d.loss_mask for d in documents if d.loss_mask is not None]
            _save_array(scratch / "loss_mask.npy", np.concatenate(masks) if masks else np.zeros(0, dtype=np.uint8))
        # meta.json last: has_part() looks for it, and only a finished folder is ever renamed into place.
        write_atomically(scratch / "meta.json", json.dumps(meta))
        try:
            scratch.rename(entry.part_folder(part))
        except OSError:
            if not entry.has_part(part):
                raise
            # Another process (a second job on the same cache) finished this part first: keep its copy.
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)


@dataclass(frozen=True)
class CachedPart:
    """One part opened read-only: memory-mapped arrays and its meta."""

    file: Path
    """The source file this part was opened for (``meta["file"]`` names the file that built it, which may be
    another file with the same content)."""
    tokens: npt.NDArray[np.uint32]
    offsets: npt.NDArray[np.int64]
    loss_mask: npt.NDArray[np.uint8] | None
    meta: dict[str, Any]

    @property
    def num_documents(self) -> int:
        return len(self.offsets) - 1


def open_part(entry: CachedFile, part: int) -> CachedPart:
    folder = entry.part_folder(part)
    if not entry.has_part(part):
        raise DataError(
            f"{entry.path}: token cache part {folder} is missing after the build; when several ranks prepare the "
            "data, data.cache_dir must be one folder that all of them see"
        )
    meta = json.loads((folder / "meta.json").read_text())
    mask_file = folder / "loss_mask.npy"
    return CachedPart(
        file=entry.path,
        tokens=_load_array(folder / "tokens.npy"),
        offsets=_load_array(folder / "offsets.npy"),
        loss_mask=_load_array(mask_file) if mask_file.is_file() else None,
        meta=meta,
    )


def line_number(path: Path, byte_offset: int) -> int:
    """1-based line number of the line starting at ``byte_offset`` (read only to log a bad line)."""
    count = 1
    with path.open("rb") as stream:
        remaining = byte_offset
        while remaining > 0 and (chunk := stream.read(min(remaining, 1 << 22))):
            count += chunk.count(b"\n")
            remaining -= len(chunk)
    return count


def _part_byte_range(entry: CachedFile, part: int) -> tuple[int, int]:
    with entry.path.open("rb") as stream:
        return _line_start_at(stream, part * PART_BYTES, entry.size), _line_start_at(
            stream, (part + 1) * PART_BYTES, entry.size
        )


def _line_start_at(stream: Any, position: int, size: int) -> int:
    """The start of the first line whose first byte is at or after ``position``."""
    if position <= 0:
        return 0
    if position >= size:
        return size
    stream.seek(position - 1)
    stream.readline()  # the rest of the line holding byte position-1 (just its newline when a line starts here)
    return min(int(stream.tell()), size)


def _tokenise_range(
    path: Path, start: int, end: int, encoder: DocumentEncoder, on_bytes: Callable[[int], None]
) -> tuple[list[Document], int, list[tuple[int, str]]]:
    """The documents of the lines in ``[start, end)``, how many lines were bad, and the first bad ones."""
    documents: list[Document] = []
    bad_lines: list[tuple[int, str]] = []  # (byte offset of the line, reason)
    bad_count = 0

    def skip(offset: int, reason: str) -> None:
        nonlocal bad_count
        bad_count += 1
        if len(bad_lines) < BAD_LINES_KEPT:
            bad_lines.append((offset, reason))

    for batch in _line_batches(path, start, end, on_bytes):
        parsed: list[str | RenderedChat] = []
        parsed_at: list[int] = []
        for offset, raw in batch:
            try:
                parsed.append(encoder.parse(raw))
                parsed_at.append(offset)
            except BadLineError as bad:
                skip(offset, str(bad))
        for offset, result in zip(parsed_at, encoder.encode(parsed), strict=True):
            if isinstance(result, BadLineError):
                skip(offset, str(result))
            else:
                documents.append(result)
    return documents, bad_count, bad_lines


def _line_batches(
    path: Path, start: int, end: int, on_bytes: Callable[[int], None]
) -> Iterator[list[tuple[int, bytes]]]:
    """The non-blank lines of ``[start, end)`` with their byte offsets, in batches; ``on_bytes(n)`` reports progress."""
    batch: list[tuple[int, bytes]] = []
    with path.open("rb") as stream:
        stream.seek(start)
        offset = reported = start
        while offset < end:
            line = stream.readline()
            if not line:
                break
            if line.strip():  # blank lines (a trailing newline) are not documents, nor bad lines
                batch.append((offset, line))
            offset += len(line)
            if len(batch) >= _ENCODE_BATCH:
                yield batch
                batch = []
                on_bytes(offset - reported)
                reported = offset
    if batch:
        yield batch
    on_bytes(offset - reported)


def _save_array(path: Path, array: npt.NDArray[Any]) -> None:
    with path.open("wb") as stream:
        np.save(stream, array, allow_pickle=False)
        stream.flush()
        os.fsync(stream.fileno())


def _load_array(path: Path) -> Any:
    return np.load(path, mmap_mode="r", allow_pickle=False)
