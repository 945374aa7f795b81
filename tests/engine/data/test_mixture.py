"""Mixing sources by weight: the tokens drawn from each source stay proportional to its weight (each source
cycling through its own epochs), and a folder source takes every ``*.jsonl`` below it in sorted order."""

from pathlib import Path

import numpy as np
import pytest
from xtrain.data import PackStream, prepare_corpus

from .corpora import data_config, pretrain_records, synthetic_corpus, write_jsonl


@pytest.mark.parametrize("weights", [[1.0, 3.0, 0.5], [1.0, 1.0, 1.0], [10.0, 1.0, 1.0]])
def test_token_shares_follow_the_weights(weights: list[float]) -> None:
    generator = np.random.default_rng(7)
    # Sources of very different sizes and document lengths: the small one cycles through many epochs.
    lengths = [generator.integers(1, 40, size=n).tolist() for n in (5, 60, 25)]
    corpus = synthetic_corpus(lengths, weights)
    packs = PackStream(corpus, 64, seed=1, lookahead=8).next_packs(300)

    # Source s owns the token values after the previous sources' (synthetic_corpus numbers them in order).
    edges = np.cumsum([0, *(sum(source) for source in lengths)]) + 1
    values = np.concatenate([pack.input_ids for pack in packs])
    counts = np.histogram(values[values != corpus.pad_id], bins=edges)[0]
    shares = counts / counts.sum()
    np.testing.assert_allclose(shares, np.asarray(weights) / sum(weights), atol=0.02)


def test_a_folder_source_mixes_with_a_file_source_by_weight(tmp_path: Path) -> None:
    folder = tmp_path / "web"
    write_jsonl(folder / "b.jsonl", pretrain_records(20, seed=2))
    write_jsonl(folder / "a" / "z.jsonl", pretrain_records(20, seed=3))
    write_jsonl(folder / "a.jsonl", pretrain_records(20, seed=4))
    (folder / "notes.txt").write_text("not a data file\n")
    books = write_jsonl(tmp_path / "books.jsonl", pretrain_records(15, seed=5))
    config = data_config([(folder, 1.0), (books, 2.0)], tmp_path / "cache", pack_tokens=32)
    corpus = prepare_corpus(config, log=lambda _: None)

    assert corpus.sources[0].files == (folder / "a" / "z.jsonl", folder / "a.jsonl", folder / "b.jsonl")
    assert corpus.sources[0].num_documents == 60
    packs = PackStream(corpus, 32, seed=0, lookahead=4).next_packs(200)
    tokens = np.zeros(2)
    for pack in packs:
        for piece in pack.pieces:
            tokens[piece.source] += piece.length
    np.testing.assert_allclose(tokens / tokens.sum(), [1 / 3, 2 / 3], atol=0.03)
