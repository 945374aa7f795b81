"""The token cache: built once and reused without tokenising, keyed by the file's content and the tokenizer (a
change of either builds a new entry), written atomically (a build killed midway leaves nothing a later run
reads), and cut into parts at line starts that together hold exactly the documents of one part."""

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, normalizers
from xtrain.data import Corpus, cache, prepare_corpus
from xtrain.data.documents import DocumentEncoder

from .corpora import EOS, EXAMPLE_TOKENIZER, copy_tokenizer, data_config, pretrain_records, write_jsonl


def cache_files(root: Path) -> dict[str, float]:
    """Every file of the cache's entries (not the digest memo) with its mtime."""
    return {
        str(path.relative_to(root)): path.stat().st_mtime_ns
        for path in root.rglob("*")
        if path.is_file() and "digests" not in path.parts
    }


def documents(corpus: Corpus) -> list[list[int]]:
    source = corpus.sources[0]
    return [source.document(index)[0].tolist() for index in range(source.num_documents)]


def reference_documents(
    texts: list[str], tokenizer_file: Path = EXAMPLE_TOKENIZER / "tokenizer.json"
) -> list[list[int]]:
    """What the tokenizers library itself makes of each text, then the end-of-document token."""
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    return [[*tokenizer.encode(text).ids, tokenizer.token_to_id(EOS)] for text in texts]


def forbid_tokenising(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("the cache was complete: nothing should be parsed or tokenised")

    monkeypatch.setattr(DocumentEncoder, "parse", refuse)
    monkeypatch.setattr(DocumentEncoder, "encode", refuse)


def test_a_second_prepare_reuses_the_cache_without_tokenising(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = write_jsonl(tmp_path / "docs.jsonl", pretrain_records(30))
    config = data_config([source], tmp_path / "cache")
    first = prepare_corpus(config, log=lambda _: None)
    assert (first.parts_built, first.parts_reused) == (1, 0)
    built = cache_files(tmp_path / "cache")
    assert any(name.endswith("tokens.npy") for name in built)

    forbid_tokenising(monkeypatch)
    second = prepare_corpus(config, log=lambda _: None)
    assert (second.parts_built, second.parts_reused) == (0, 1)
    assert cache_files(tmp_path / "cache") == built  # not one file rewritten
    assert documents(second) == documents(first)


def test_a_changed_file_builds_a_new_entry(tmp_path: Path) -> None:
    source = tmp_path / "docs.jsonl"
    config = data_config([source], tmp_path / "cache")
    write_jsonl(source, [{"text": "alpha beta"}, {"text": "gamma"}])
    stamp = source.stat()
    assert documents(prepare_corpus(config, log=lambda _: None)) == reference_documents(["alpha beta", "gamma"])

    # Same size, and the old mtime put back (as cp -p or rsync -t would): only the content tells.
    write_jsonl(source, [{"text": "gamma beta"}, {"text": "alpha"}])
    os.utime(source, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert source.stat().st_size == stamp.st_size
    changed = prepare_corpus(config, log=lambda _: None)
    assert changed.parts_built == 1
    assert documents(changed) == reference_documents(["gamma beta", "alpha"])


def test_the_digest_memo_is_used_only_while_the_file_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": "alpha beta"}])
    root = tmp_path / "cache"
    real = cache.file_digest(source, root)
    (memo,) = (root / "digests").glob("*.json")

    def tamper() -> None:  # a memo that lies shows whether it was believed
        memo.write_text(json.dumps({**json.loads(memo.read_text()), "digest": "remembered"}))

    tamper()
    assert cache.file_digest(source, root) == real  # just written: within the racy margin, hashed again
    monkeypatch.setattr(cache, "RACY_MARGIN_NS", -(10**9))  # as if the file had been written long ago
    tamper()
    assert cache.file_digest(source, root) == "remembered"  # unchanged file: the memo spares the hash

    time.sleep(0.05)  # past the file system's clock tick, so the rewrite gets a new ctime
    stamp = source.stat()
    write_jsonl(source, [{"text": "gamma beta"}])
    os.utime(source, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert cache.file_digest(source, root) not in {"remembered", real}


def test_another_tokenizer_or_chat_template_builds_a_new_entry(tmp_path: Path) -> None:
    texts = ["Alpha Beta", "GAMMA delta"]
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": text} for text in texts])
    folder = copy_tokenizer(tmp_path / "tokenizer")
    config = data_config([source], tmp_path / "cache", tokenizer=folder)
    assert prepare_corpus(config, log=lambda _: None).parts_built == 1

    config_file = folder / "tokenizer_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "chat_template": "{{ messages }}"}))
    assert prepare_corpus(config, log=lambda _: None).parts_built == 1

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.save(str(folder / "tokenizer.json"))
    lowercased = prepare_corpus(config, log=lambda _: None)
    assert lowercased.parts_built == 1
    assert documents(lowercased) == reference_documents(texts, folder / "tokenizer.json")
    assert documents(lowercased) != reference_documents(texts)
    assert len([entry for entry in (tmp_path / "cache").iterdir() if entry.name != "digests"]) == 3


def test_pretrain_and_chat_of_the_same_file_are_separate_entries(tmp_path: Path) -> None:
    chat = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "text": "both"}
    source = write_jsonl(tmp_path / "both.jsonl", [chat])
    as_pretrain = prepare_corpus(data_config([source], tmp_path / "cache"), log=lambda _: None)
    as_chat = prepare_corpus(data_config([source], tmp_path / "cache", kind="chat"), log=lambda _: None)
    assert as_chat.parts_built == 1
    assert documents(as_pretrain) == reference_documents(["both"])
    assert as_chat.sources[0].document(0)[1] is not None


def test_a_build_killed_midway_leaves_no_part_a_later_run_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = write_jsonl(tmp_path / "docs.jsonl", pretrain_records(10))
    config = data_config([source], tmp_path / "cache")
    real_save = cache._save_array

    def save_then_die(path: Path, array: np.ndarray) -> None:
        real_save(path, array)
        # The tokens are on disk, the offsets not yet: whatever is visible now must not pass for a part.
        entry_folder = path.parent.parent
        assert not list(entry_folder.glob("part-00000"))
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(cache, "_save_array", save_then_die)
    monkeypatch.setattr(shutil, "rmtree", lambda *_, **__: None)  # a killed process cleans nothing up
    with pytest.raises(KeyboardInterrupt):
        prepare_corpus(config, log=lambda _: None)
    monkeypatch.undo()
    (entry,) = [folder for folder in (tmp_path / "cache").iterdir() if folder.name != "digests"]
    (leftover,) = [child for child in entry.iterdir() if child.is_dir()]
    assert leftover.name.startswith("part-00000.tmp-")  # the scratch folder, which nothing reads

    rebuilt = prepare_corpus(config, log=lambda _: None)
    assert rebuilt.parts_built == 1
    assert documents(rebuilt) == reference_documents([record["text"] for record in pretrain_records(10)])


def test_parts_cut_at_line_starts_hold_the_same_documents_as_one_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = pretrain_records(30, seed=4)
    source = write_jsonl(tmp_path / "docs.jsonl", records)
    whole = documents(prepare_corpus(data_config([source], tmp_path / "one-part"), log=lambda _: None))
    monkeypatch.setattr(cache, "PART_BYTES", 97)  # cuts fall inside lines, and on their starts
    corpus = prepare_corpus(data_config([source], tmp_path / "parts"), log=lambda _: None)
    assert corpus.parts_built == -(-source.stat().st_size // 97) > 10
    assert documents(corpus) == whole == reference_documents([record["text"] for record in records])
