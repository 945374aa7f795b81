"""The data position: ``PackStream.state_dict()`` is small, JSON-serialisable, and restoring it (into a stream
over a corpus opened afresh from the cache) continues with exactly the packs an uninterrupted stream gives."""

import json
from pathlib import Path

import numpy as np
import pytest
from xtrain.data import Corpus, DataConfig, Pack, PackStream, prepare_corpus
from xtrain.errors import DataError

from .corpora import data_config, pretrain_records, synthetic_corpus, write_jsonl

PACK_TOKENS = 24


def assert_same_packs(actual: list[Pack], expected: list[Pack]) -> None:
    assert [pack.pack_id for pack in actual] == [pack.pack_id for pack in expected]
    for got, want in zip(actual, expected, strict=True):
        np.testing.assert_array_equal(got.input_ids, want.input_ids)
        np.testing.assert_array_equal(got.labels, want.labels)
        np.testing.assert_array_equal(got.cu_seqlens, want.cu_seqlens)


@pytest.fixture
def corpus_config(tmp_path: Path) -> DataConfig:
    # Two sources, documents both shorter and longer than a pack, so positions fall mid-document and mid-epoch.
    first = write_jsonl(tmp_path / "first.jsonl", pretrain_records(9, seed=11))
    second = write_jsonl(tmp_path / "second.jsonl", pretrain_records(4, seed=12))
    return data_config([(first, 2.0), (second, 1.0)], tmp_path / "cache", pack_tokens=PACK_TOKENS)


def open_corpus(config: DataConfig) -> Corpus:
    return prepare_corpus(config, log=lambda _: None)


@pytest.mark.parametrize("consumed", [0, 1, 7, 40, 131])  # 131 packs: several epochs of both sources
def test_restoring_the_position_continues_with_the_same_packs(corpus_config: DataConfig, consumed: int) -> None:
    uninterrupted = PackStream(open_corpus(corpus_config), PACK_TOKENS, seed=5, lookahead=6)
    expected = uninterrupted.next_packs(consumed + 30)[consumed:]

    interrupted = PackStream(open_corpus(corpus_config), PACK_TOKENS, seed=5, lookahead=6)
    interrupted.next_packs(consumed)
    saved = json.loads(json.dumps(interrupted.state_dict()))  # what a checkpoint would write and read back

    resumed = PackStream(open_corpus(corpus_config), PACK_TOKENS, seed=5, lookahead=6)
    resumed.load_state_dict(saved)
    assert_same_packs(resumed.next_packs(30), expected)
    assert resumed.epochs == uninterrupted.epochs


def test_the_position_stays_small_however_far_the_stream_has_gone() -> None:
    corpus = synthetic_corpus([[50] * 30, [7] * 200])
    stream = PackStream(corpus, 16, seed=0, lookahead=64)
    stream.next_packs(10)
    early = len(json.dumps(stream.state_dict()))
    stream.next_packs(1000)
    late = len(json.dumps(stream.state_dict()))
    assert late < 4 * 1024 and late < 2 * early  # bounded by the lookahead, not by the packs consumed


@pytest.mark.parametrize(
    ("change", "key"),
    [({"seed": 6}, "seed"), ({"pack_tokens": 32}, "pack_tokens"), ({"lookahead": 7}, "lookahead")],
)
def test_a_position_saved_with_other_settings_is_refused(change: dict[str, int], key: str) -> None:
    corpus = synthetic_corpus([[5, 9, 30]])
    settings = {"seed": 5, "pack_tokens": 24, "lookahead": 6}
    saved = PackStream(corpus, settings["pack_tokens"], settings["seed"], lookahead=settings["lookahead"])
    saved.next_packs(3)
    other = {**settings, **change}
    resumed = PackStream(corpus, other["pack_tokens"], other["seed"], lookahead=other["lookahead"])
    with pytest.raises(DataError, match=key):
        resumed.load_state_dict(saved.state_dict())


def test_a_position_saved_on_other_data_is_refused() -> None:
    saved = PackStream(synthetic_corpus([[5, 9, 30]]), 24, 5)
    resumed = PackStream(synthetic_corpus([[5, 9, 31]]), 24, 5)
    with pytest.raises(DataError, match="corpus"):
        resumed.load_state_dict(saved.state_dict())
