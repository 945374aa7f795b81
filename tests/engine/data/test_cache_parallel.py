"""Two real processes (gloo) building the token cache together: each tokenises its own share of the parts, and
the cache, the packs and the data position are exactly those of one process building it alone."""

from pathlib import Path

import pytest
from xtrain.data import PackStream, cache, prepare_corpus

from .corpora import REPO_ROOT, data_config, pretrain_records, write_jsonl
from .rank_worker import prepare_on_rank

PART_BYTES = 300
NUM_PACKS = 12


def cache_contents(root: Path) -> dict[str, bytes]:
    """Every file of the cache's entries (the digest memo, which records when it hashed, aside)."""
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "digests" not in path.parts
    }


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_ranks_build_the_same_cache_as_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ..parallel.ranks import run_ranks  # deferred: it imports torch, which only this test needs

    files = [write_jsonl(tmp_path / f"data-{index}.jsonl", pretrain_records(25, seed=index)) for index in range(3)]
    sources = [files[0], (files[1], 2.0), files[2]]

    monkeypatch.setattr(cache, "PART_BYTES", PART_BYTES)
    alone = prepare_corpus(data_config(sources, tmp_path / "alone", pack_tokens=48), log=lambda _: None)
    alone_stream = PackStream(alone, 48, seed=0)
    alone_packs = [pack.input_ids.tolist() for pack in alone_stream.next_packs(NUM_PACKS)]

    monkeypatch.syspath_prepend(str(REPO_ROOT))  # the spawned processes import this test package by name
    together = data_config(sources, tmp_path / "together", pack_tokens=48)
    ranks = run_ranks(2, prepare_on_rank, together, PART_BYTES, NUM_PACKS, tmp_dir=tmp_path / "ranks")

    assert alone.parts_built > 4
    assert [rank["parts_built"] for rank in ranks] == [-(-alone.parts_built // 2), alone.parts_built // 2]
    assert cache_contents(tmp_path / "together") == cache_contents(tmp_path / "alone")
    for rank in ranks:  # every rank sees the one global stream, and the same position
        assert rank["packs"] == alone_packs
        assert rank["state"] == alone_stream.state_dict()
