"""Prepare the token cache of a data config (in parallel across ranks) and open it as a :class:`Corpus`.

``prepare_corpus`` runs on every rank: each rank hashes and tokenises its share of the work (parts of files,
``task i`` belongs to rank ``i % world_size``), calls ``barrier()``, then opens the complete cache. The caller
owns the process group: this module never touches torch.distributed, it only calls the ``barrier`` it is given.
With several ranks, ``cache_dir`` must be one folder they all see (a shared file system); on nodes with
node-local caches pass each node's local rank, local world size and a node-local barrier instead.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from xtrain.data.cache import (
    PART_BYTES,
    CachedFile,
    CachedPart,
    build_part,
    discover_files,
    line_number,
    open_part,
    plan_file,
)
from xtrain.data.config import DataConfig
from xtrain.data.documents import DocumentEncoder
from xtrain.data.tokenizer import load_tokenizer_folder
from xtrain.errors import DataError

BAD_LINES_LOGGED = 5
"""How many bad lines (file:line and reason) a prepare logs; all of them are counted in ``skipped_lines``."""


@dataclass(frozen=True)
class SourceDocuments:
    """Every document of one ``data.sources`` entry, across its files and cache parts, in file order."""

    path: Path
    weight: float
    files: tuple[Path, ...]
    parts: tuple[CachedPart, ...]
    lengths: npt.NDArray[np.int64]
    """Token count of each document (int64 [documents])."""
    part_starts: npt.NDArray[np.int64] = field(repr=False)
    """Index of the first document of each part, then the total (int64 [parts + 1])."""

    @property
    def num_documents(self) -> int:
        return len(self.lengths)

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    def document(self, index: int) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint8] | None]:
        """Token ids of document ``index`` and its loss mask (None for pretraining: every token carries loss)."""
        part_index = int(np.searchsorted(self.part_starts, index, side="right")) - 1
        part = self.parts[part_index]
        local = index - int(self.part_starts[part_index])
        start, end = int(part.offsets[local]), int(part.offsets[local + 1])
        mask = part.loss_mask[start:end] if part.loss_mask is not None else None
        return part.tokens[start:end], mask


@dataclass(frozen=True)
class Corpus:
    """The tokenised documents of every source, memory-mapped from the cache."""

    kind: Literal["pretrain", "chat"]
    sources: tuple[SourceDocuments, ...]
    skipped_lines: int
    """Lines of the source files that were not usable documents (counted over the whole corpus)."""
    vocab_size: int
    pad_id: int
    """Id written into padding: the tokenizer's pad token, else its eos token, else 0 (padding has no loss)."""
    cache_dir: Path
    parts_reused: int
    """Cache parts this rank found already built (its share of the work)."""
    parts_built: int
    """Cache parts this rank tokenised."""

    @property
    def num_documents(self) -> int:
        return sum(source.num_documents for source in self.sources)

    @property
    def num_tokens(self) -> int:
        return sum(source.num_tokens for source in self.sources)

    @property
    def num_files(self) -> int:
        return sum(len(source.files) for source in self.sources)


def prepare_corpus(
    config: DataConfig,
    *,
    rank: int = 0,
    world_size: int = 1,
    barrier: Callable[[], None] = lambda: None,
    progress: bool = False,
    log: Callable[[str], None] = print,
) -> Corpus:
    """Build what is missing of the token cache (this rank's share), wait for all ranks, open the whole cache.

    Raises DataError (naming the file) for a missing source, a folder without .jsonl, a bad tokenizer folder, or
    a source without a single valid line. Every rank raises the same error, before or after the same barriers.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    folder = load_tokenizer_folder(config.tokenizer)
    encoder = DocumentEncoder(folder, config.kind)
    source_files = [discover_files(source) for source in config.sources]
    cache_root = config.resolved_cache_dir()
    cache_root.mkdir(parents=True, exist_ok=True)

    # Content digests: each rank hashes its share and leaves it in the digest memo, so no file is read by all.
    all_files = sorted({path for files in source_files for path in files})
    for path in all_files[rank::world_size]:
        plan_file(path, cache_root, folder.fingerprint, config.kind)
    barrier()
    entries = {path: plan_file(path, cache_root, folder.fingerprint, config.kind) for path in all_files}

    tasks = [(entries[path], part) for path in all_files for part in range(entries[path].num_parts)]
    mine = tasks[rank::world_size]
    missing = [(entry, part) for entry, part in mine if not entry.has_part(part)]
    _build(missing, encoder, progress)
    barrier()

    sources = tuple(
        _open_source(source.path, source.weight, [entries[path] for path in files])
        for source, files in zip(config.sources, source_files, strict=True)
    )
    corpus = Corpus(
        kind=config.kind,
        sources=sources,
        skipped_lines=sum(int(part.meta["skipped_lines"]) for source in sources for part in source.parts),
        vocab_size=folder.vocab_size,
        pad_id=_pad_id(folder.token_id("pad_token"), folder.token_id("eos_token")),
        cache_dir=cache_root,
        parts_reused=len(mine) - len(missing),
        parts_built=len(missing),
    )
    # An unusable source first: its error names the file and its first bad line, as the one message the user sees.
    for source in sources:
        if source.num_documents == 0:
            raise DataError(f"{source.path}: no valid line in this data source{_first_bad_line(source)}")
    _log_bad_lines(corpus, log)
    return corpus


@dataclass(frozen=True)
class PrepareSummary:
    """What ``xtrain data prepare`` reports."""

    files: int
    documents: int
    tokens: int
    skipped_lines: int
    cache_hits: int
    """Cache parts found already built (a file is one part per 32 MiB)."""
    cache_misses: int
    """Cache parts tokenised by this prepare."""
    cache_dir: Path
    seconds: float

    def describe(self) -> str:
        return (
            f"{self.files} files, {self.documents:,} documents, {self.tokens:,} tokens, "
            f"{self.skipped_lines:,} skipped lines; cache: {self.cache_hits} parts reused, "
            f"{self.cache_misses} built in {self.seconds:.1f} s ({self.cache_dir})"
        )


def run_prepare(config: DataConfig, *, log: Callable[[str], None] = print, progress: bool = True) -> PrepareSummary:
    """Build the token cache of ``config`` in this one process (``xtrain data prepare``) and summarise it.

    ``log`` gets the skipped lines; printing the summary is the caller's (the CLI prints ``describe()``)."""
    started = time.perf_counter()
    corpus = prepare_corpus(config, progress=progress, log=log)
    return PrepareSummary(
        files=corpus.num_files,
        documents=corpus.num_documents,
        tokens=corpus.num_tokens,
        skipped_lines=corpus.skipped_lines,
        cache_hits=corpus.parts_reused,
        cache_misses=corpus.parts_built,
        cache_dir=corpus.cache_dir,
        seconds=time.perf_counter() - started,
    )


def _build(tasks: list[tuple[CachedFile, int]], encoder: DocumentEncoder, progress: bool) -> None:
    columns = (TextColumn("tokenising"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    total = sum(_part_size(entry, part) for entry, part in tasks)
    # On stderr, where the log goes: stdout stays for the summary a script may read.
    with Progress(*columns, console=Console(stderr=True), disable=not progress or not tasks) as bar:
        task_id = bar.add_task("tokenising", total=total)
        for entry, part in tasks:
            build_part(entry, part, encoder, lambda done: bar.advance(task_id, done))


def _part_size(entry: CachedFile, part: int) -> int:
    return max(0, min(PART_BYTES, entry.size - part * PART_BYTES))


def _open_source(path: Path, weight: float, entries: list[CachedFile]) -> SourceDocuments:
    parts = tuple(open_part(entry, part) for entry in entries for part in range(entry.num_parts))
    counts = np.asarray([part.num_documents for part in parts], dtype=np.int64)
    part_starts = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum(counts, out=part_starts[1:])
    lengths = np.concatenate([np.diff(np.asarray(part.offsets)) for part in parts]).astype(np.int64)
    return SourceDocuments(
        path=path,
        weight=weight,
        files=tuple(entry.path for entry in entries),
        parts=parts,
        lengths=lengths,
        part_starts=part_starts,
    )


def _pad_id(pad: int | None, eos: int | None) -> int:
    if pad is not None:
        return pad
    return eos if eos is not None else 0


def _bad_lines(source: SourceDocuments) -> list[tuple[Path, int, str]]:
    return [(part.file, int(offset), str(reason)) for part in source.parts for offset, reason in part.meta["bad_lines"]]


def _first_bad_line(source: SourceDocuments) -> str:
    skipped = sum(int(part.meta["skipped_lines"]) for part in source.parts)
    bad = _bad_lines(source)
    if not bad:
        return " (its files hold no line at all)"
    path, offset, reason = bad[0]
    return f" ({skipped} lines skipped; the first, {path}:{line_number(path, offset)}: {reason})"


def _log_bad_lines(corpus: Corpus, log: Callable[[str], None]) -> None:
    if corpus.skipped_lines == 0:
        return
    bad = [line for source in corpus.sources for line in _bad_lines(source)][:BAD_LINES_LOGGED]
    for path, offset, reason in bad:
        log(f"skipped {path}:{line_number(path, offset)}: {reason}")
    if corpus.skipped_lines > len(bad):
        log(f"skipped {corpus.skipped_lines} bad lines in all (the first {len(bad)} above)")
