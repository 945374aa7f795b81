"""Small inputs for the data pipeline tests: JSONL files, data configs, and corpora built straight from arrays."""

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from xtrain.data import Corpus, DataConfig
from xtrain.data.cache import CachedPart
from xtrain.data.corpus import SourceDocuments

REPO_ROOT = Path(__file__).resolve().parents[3]
EXAMPLE_TOKENIZER = REPO_ROOT / "examples" / "tokenizer"
EOS = "<|endoftext|>"


def write_jsonl(path: Path, records: Sequence[Any]) -> Path:
    """One line per record: a dict or list is JSON-encoded, a str is written as it is (to make bad lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [record if isinstance(record, str) else json.dumps(record) for record in records]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def pretrain_records(count: int, seed: int = 0) -> list[dict[str, str]]:
    """``count`` lines ``{"text": ...}`` of varied length, from a fixed word list."""
    words = ["the", "expert", "router", "shards", "gradients", "mesh", "ün", "ïcode", "12", "3.5", "—", "tokens"]
    generator = np.random.default_rng(seed)
    return [
        {"text": " ".join(words[i] for i in generator.integers(0, len(words), size=int(generator.integers(1, 40))))}
        for _ in range(count)
    ]


def data_config(
    sources: Sequence[Path | tuple[Path, float]],
    cache_dir: Path,
    *,
    kind: Literal["pretrain", "chat"] = "pretrain",
    tokenizer: Path = EXAMPLE_TOKENIZER,
    pack_tokens: int = 64,
) -> DataConfig:
    entries = [{"path": s[0], "weight": s[1]} if isinstance(s, tuple) else {"path": s} for s in sources]
    return DataConfig.model_validate(
        {"sources": entries, "kind": kind, "tokenizer": tokenizer, "pack_tokens": pack_tokens, "cache_dir": cache_dir}
    )


def synthetic_corpus(lengths: Sequence[Sequence[int]], weights: Sequence[float] | None = None) -> Corpus:
    """A corpus without tokenizer or cache: source s holds documents of ``lengths[s]`` tokens.

    Every token of the corpus has its own value (1, 2, 3, ... in source and document order), so a token that a
    pack loses or repeats shows in the values alone; 0 is the padding id.
    """
    weights = weights or [1.0] * len(lengths)
    sources = []
    next_value = 1
    for index, (source_lengths, weight) in enumerate(zip(lengths, weights, strict=True)):
        sizes = np.asarray(source_lengths, dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        tokens = np.arange(next_value, next_value + int(offsets[-1]), dtype=np.uint32)
        next_value += int(offsets[-1])
        part = CachedPart(file=Path(f"source-{index}.jsonl"), tokens=tokens, offsets=offsets, loss_mask=None, meta={})
        sources.append(
            SourceDocuments(
                path=part.file,
                weight=weight,
                files=(part.file,),
                parts=(part,),
                lengths=sizes,
                part_starts=np.asarray([0, len(sizes)], dtype=np.int64),
            )
        )
    return Corpus(
        kind="pretrain",
        sources=tuple(sources),
        skipped_lines=0,
        vocab_size=next_value,
        pad_id=0,
        cache_dir=Path("unused"),
        parts_reused=0,
        parts_built=0,
    )


def segments(cu_seqlens: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each segment of a pack."""
    bounds = [int(b) for b in cu_seqlens]
    return list(itertools.pairwise(bounds))


def load_hf_tokenizer(folder: Path) -> Any:
    """transformers' tokenizer of a local folder (nothing downloaded)."""
    # Deferred: importing transformers costs seconds, paid only by the tests that compare with it.
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def copy_tokenizer(destination: Path, *, chat_template: str | None = None) -> Path:
    """A copy of the example tokenizer folder, optionally with another chat template."""
    destination.mkdir(parents=True)
    (destination / "tokenizer.json").write_bytes((EXAMPLE_TOKENIZER / "tokenizer.json").read_bytes())
    config = json.loads((EXAMPLE_TOKENIZER / "tokenizer_config.json").read_text())
    if chat_template is not None:
        config["chat_template"] = chat_template
    (destination / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return destination


def assemble_documents(packs: Sequence[Any], corpus: Corpus) -> dict[tuple[int, int, int], tuple[list[int], list[int]]]:
    """Each (source, document, epoch) whose every piece is in ``packs``: its input ids and labels put back in
    document order (pieces laid out from their ``start``)."""
    by_document: dict[tuple[int, int, int], dict[int, tuple[list[int], list[int]]]] = {}
    for pack in packs:
        at = 0
        for piece in pack.pieces:
            window = slice(at, at + piece.length)
            pieces = by_document.setdefault((piece.source, piece.document, piece.epoch), {})
            assert piece.start not in pieces, f"piece {piece} twice"
            pieces[piece.start] = (pack.input_ids[window].tolist(), pack.labels[window].tolist())
            at += piece.length
    assembled = {}
    for key, pieces in by_document.items():
        ids: list[int] = []
        labels: list[int] = []
        for start in sorted(pieces):
            if start != len(ids):
                break  # a piece before this one is not in ``packs``
            ids += pieces[start][0]
            labels += pieces[start][1]
        if len(ids) == int(corpus.sources[key[0]].lengths[key[1]]):
            assembled[key] = (ids, labels)
    return assembled
