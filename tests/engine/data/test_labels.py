"""Pack labels: each position is labelled with the token that follows it in its document (``labels[t]`` is what
input ``t`` predicts), -100 on a document's last token, on padding, and, for chat, wherever the next token is not
an assistant token (per transformers' assistant mask). Cutting a long document into pieces loses no target."""

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer
from xtrain.data import PackStream, prepare_corpus
from xtrain.data.packing import IGNORE_INDEX

from .corpora import EOS, EXAMPLE_TOKENIZER, REPO_ROOT, assemble_documents, data_config, pretrain_records, write_jsonl
from .corpora import segments as pack_segments


def expected_labels(ids: list[int], carries_loss: list[int] | None = None) -> list[int]:
    """The next token at every position (when it carries loss), nothing after the last."""
    following = [
        ids[t + 1] if carries_loss is None or carries_loss[t + 1] else IGNORE_INDEX for t in range(len(ids) - 1)
    ]
    return [*following, IGNORE_INDEX]


@pytest.mark.parametrize("pack_tokens", [512, 16])  # whole documents; documents cut into several pieces
def test_pretrain_labels_are_the_next_token_of_the_document(tmp_path: Path, pack_tokens: int) -> None:
    records = pretrain_records(12, seed=1)
    source = write_jsonl(tmp_path / "docs.jsonl", records)
    corpus = prepare_corpus(data_config([source], tmp_path / "cache", pack_tokens=pack_tokens), log=lambda _: None)
    packs = PackStream(corpus, pack_tokens, seed=0, lookahead=4).next_packs(80)

    reference = Tokenizer.from_file(str(EXAMPLE_TOKENIZER / "tokenizer.json"))
    eos_id = reference.token_to_id(EOS)
    documents = assemble_documents(packs, corpus)
    assert {document for _, document, epoch in documents if epoch == 0} == set(range(len(records)))
    for (_, document, _), (ids, labels) in documents.items():
        expected_ids = [*reference.encode(records[document]["text"]).ids, eos_id]
        assert ids == expected_ids
        assert labels == expected_labels(expected_ids)
    for pack in packs:
        assert pack.num_loss_tokens == int((pack.labels != IGNORE_INDEX).sum())
        padding_start = sum(piece.length for piece in pack.pieces)
        assert (pack.labels[padding_start:] == IGNORE_INDEX).all()
        assert (pack.input_ids[padding_start:] == corpus.pad_id).all()


@pytest.mark.slow
@pytest.mark.parametrize("pack_tokens", [256, 24])
def test_chat_labels_are_the_next_token_where_it_is_an_assistant_token(
    tmp_path: Path, hf_tokenizer: Any, pack_tokens: int
) -> None:
    sample = REPO_ROOT / "tools" / "demo_data" / "chat_sample.jsonl"
    chats = [json.loads(line)["messages"] for line in sample.read_text().splitlines()[:3]]
    source = write_jsonl(tmp_path / "chat.jsonl", [{"messages": messages} for messages in chats])
    config = data_config([source], tmp_path / "cache", kind="chat", pack_tokens=pack_tokens)
    corpus = prepare_corpus(config, log=lambda _: None)
    packs = PackStream(corpus, pack_tokens, seed=3, lookahead=4).next_packs(40)

    documents = assemble_documents(packs, corpus)
    assert {document for _, document, epoch in documents if epoch == 0} == set(range(len(chats)))
    for (_, document, _), (ids, labels) in documents.items():
        reference = hf_tokenizer.apply_chat_template(
            chats[document], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        assert ids == list(reference["input_ids"])
        assert labels == expected_labels(ids, list(reference["assistant_masks"]))
    if pack_tokens == 256:  # whole conversations: each segment is one of them, found by its ids alone
        whole = {tuple(hf_tokenizer.apply_chat_template(messages)["input_ids"]) for messages in chats}
        for pack in packs:
            pieces = pack_segments(pack.cu_seqlens)[: len(pack.pieces)]
            assert all(tuple(pack.input_ids[start:end].tolist()) in whole for start, end in pieces)
