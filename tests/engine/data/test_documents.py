"""JSONL lines to token documents, end to end through the cache, against independent references: the
``tokenizers`` library for pretraining text, transformers' ``apply_chat_template`` for chat (text, ids and the
assistant mask), and the lines that must be refused."""

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer, processors
from xtrain.data import prepare_corpus
from xtrain.data.documents import BadLineError, DocumentEncoder
from xtrain.data.tokenizer import load_tokenizer_folder

from .corpora import EOS, EXAMPLE_TOKENIZER, REPO_ROOT, copy_tokenizer, data_config, load_hf_tokenizer, write_jsonl

TEXTS = [
    "The router sends each token to two experts.",
    "  leading spaces, trailing newline\n",
    "Grüße aus Köln — naïve café 👋 12.5%",
    "two\n\nparagraphs\twith a tab",
    f"a literal {EOS} in the middle",
]

CHATML_WITHOUT_GENERATION = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
REASONING_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}{% if message['role'] == 'assistant' %}"
    "{% generation %}{% if message.reasoning_content is defined %}{{ '<think>' + message.reasoning_content + "
    "'</think>' }}{% endif %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}{% else %}"
    "{{ message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
)


def conversations() -> list[list[dict[str, Any]]]:
    sample = REPO_ROOT / "tools" / "demo_data" / "chat_sample.jsonl"
    from_sample = [json.loads(line)["messages"] for line in sample.read_text().splitlines()[:4]]
    return [
        *from_sample,
        [
            {"role": "system", "content": "Answer in one line."},
            {"role": "user", "content": "What is a pack?"},
            {"role": "assistant", "content": "A row of exactly pack_tokens tokens."},
            {"role": "user", "content": "And cu_seqlens?"},
            {"role": "assistant", "content": "  Where each document ends.\n"},
        ],
        [
            {"role": "user", "content": "Grüße 👋", "name": None},  # transformers drops keys set to None
            {"role": "assistant", "content": "Hallo — naïve!"},
            {"role": "tool", "content": '{"result": 4}'},
            {"role": "assistant", "content": ""},
        ],
    ]


def test_pretrain_documents_are_the_tokenizers_encoding_then_eos(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": text} for text in TEXTS])
    corpus = prepare_corpus(data_config([source], tmp_path / "cache"), log=lambda _: None)

    reference = Tokenizer.from_file(str(EXAMPLE_TOKENIZER / "tokenizer.json"))
    eos_id = reference.token_to_id(EOS)
    documents = corpus.sources[0]
    assert documents.num_documents == len(TEXTS)
    for index, text in enumerate(TEXTS):
        ids, loss_mask = documents.document(index)
        assert ids.tolist() == [*reference.encode(text).ids, eos_id], text
        assert loss_mask is None  # pretraining: every token carries loss


def test_a_post_processor_that_adds_bos_and_eos_is_kept_and_eos_not_doubled(tmp_path: Path) -> None:
    folder = copy_tokenizer(tmp_path / "tokenizer")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"<|im_start|> $A {EOS}",
        special_tokens=[("<|im_start|>", tokenizer.token_to_id("<|im_start|>")), (EOS, tokenizer.token_to_id(EOS))],
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": text} for text in TEXTS[:3]])
    corpus = prepare_corpus(data_config([source], tmp_path / "cache", tokenizer=folder), log=lambda _: None)

    for index, text in enumerate(TEXTS[:3]):
        expected = tokenizer.encode(text).ids  # what transformers' tokenizer(text) gives: BOS ... EOS
        assert expected[0] == tokenizer.token_to_id("<|im_start|>") and expected[-1] == tokenizer.token_to_id(EOS)
        assert corpus.sources[0].document(index)[0].tolist() == expected


@pytest.mark.slow
def test_chat_text_ids_and_assistant_mask_equal_apply_chat_template(tmp_path: Path, hf_tokenizer: Any) -> None:
    chats = conversations()
    source = write_jsonl(tmp_path / "chat.jsonl", [{"messages": messages} for messages in chats])
    corpus = prepare_corpus(data_config([source], tmp_path / "cache", kind="chat"), log=lambda _: None)
    encoder = DocumentEncoder(load_tokenizer_folder(EXAMPLE_TOKENIZER), "chat")

    assert corpus.sources[0].num_documents == len(chats)
    for index, messages in enumerate(chats):
        reference = hf_tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        rendered = encoder.parse(json.dumps({"messages": messages}))
        assert not isinstance(rendered, str)
        assert rendered.text == hf_tokenizer.apply_chat_template(messages, tokenize=False)
        ids, loss_mask = corpus.sources[0].document(index)
        assert loss_mask is not None
        assert ids.tolist() == list(reference["input_ids"])
        assert loss_mask.tolist() == list(reference["assistant_masks"])
        assert 0 < loss_mask.sum() < len(loss_mask)


@pytest.mark.slow
def test_reasoning_under_any_of_its_names_renders_as_transformers_renders_it(tmp_path: Path) -> None:
    folder = copy_tokenizer(tmp_path / "tokenizer", chat_template=REASONING_TEMPLATE)
    reference = load_hf_tokenizer(folder)
    encoder = DocumentEncoder(load_tokenizer_folder(folder), "chat")
    for name in ("reasoning_content", "thinking", "reasoning"):
        messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", name: "add them"}]
        expected = reference.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        rendered = encoder.parse(json.dumps({"messages": messages}))
        assert not isinstance(rendered, str)
        assert "<think>add them</think>" in rendered.text
        (document,) = encoder.encode([rendered])
        assert not isinstance(document, BadLineError) and document.loss_mask is not None
        assert document.ids.tolist() == list(expected["input_ids"])
        assert document.loss_mask.tolist() == list(expected["assistant_masks"])


def test_without_generation_marks_each_reply_and_its_closing_carry_the_loss(tmp_path: Path) -> None:
    folder = copy_tokenizer(tmp_path / "tokenizer", chat_template=CHATML_WITHOUT_GENERATION)
    replies = ["Sharded parameters.", "Grüße, 12 experts."]
    messages = [
        {"role": "user", "content": "What does FSDP shard?"},
        {"role": "assistant", "content": replies[0]},
        {"role": "user", "content": "Anything else?"},
        {"role": "assistant", "content": replies[1]},
    ]
    source = write_jsonl(tmp_path / "chat.jsonl", [{"messages": messages}])
    corpus = prepare_corpus(
        data_config([source], tmp_path / "cache", kind="chat", tokenizer=folder), log=lambda _: None
    )
    ids, loss_mask = corpus.sources[0].document(0)
    assert loss_mask is not None

    # The runs of loss tokens, decoded independently, are exactly what each assistant turn adds to the text.
    decoder = Tokenizer.from_file(str(folder / "tokenizer.json"))
    edges = np.flatnonzero(np.diff(np.concatenate([[0], loss_mask, [0]])))
    runs = [ids[start:end].tolist() for start, end in zip(edges[::2], edges[1::2], strict=True)]
    assert [decoder.decode(run, skip_special_tokens=False) for run in runs] == [f"{r}<|im_end|>\n" for r in replies]


def test_a_template_that_rewrites_earlier_turns_without_marks_is_a_bad_line(tmp_path: Path) -> None:
    rewriting = "{% for m in messages %}{% if loop.last %}[final] {% endif %}{{ m['content'] }}\n{% endfor %}"
    folder = copy_tokenizer(tmp_path / "tokenizer", chat_template=rewriting)
    encoder = DocumentEncoder(load_tokenizer_folder(folder), "chat")
    line = json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})
    with pytest.raises(BadLineError, match="generation"):
        encoder.parse(line)


@pytest.mark.parametrize(
    ("kind", "line", "reason"),
    [
        ("pretrain", '{"text": "unterminated', "invalid JSON"),
        ("pretrain", "[1, 2]", "JSON object"),
        ("pretrain", '{"body": "wrong field"}', 'missing field "text"'),
        ("pretrain", '{"text": "  \\n "}', 'empty "text"'),
        ("pretrain", '{"text": 42}', "must be a string"),
        ("chat", '{"text": "not a chat"}', 'missing field "messages"'),
        ("chat", '{"messages": []}', "non-empty list"),
        ("chat", '{"messages": [{"role": "robot", "content": "beep"}]}', "unknown role 'robot'"),
        ("chat", '{"messages": [{"role": "user"}]}', 'no "content"'),
        ("chat", '{"messages": [{"content": "who?"}]}', 'no "role"'),
        ("chat", '{"messages": [{"role": "user", "content": "only a question"}]}', "no assistant message"),
    ],
)
def test_lines_that_are_not_documents_are_refused_with_their_reason(kind: str, line: str, reason: str) -> None:
    encoder = DocumentEncoder(load_tokenizer_folder(EXAMPLE_TOKENIZER), kind)  # type: ignore[arg-type]
    with pytest.raises(BadLineError, match=reason.replace("(", r"\(")):
        encoder.parse(line)


@pytest.mark.parametrize(
    ("kind", "line"),
    [
        ("pretrain", '{"text": "fine", "id": 3}'),
        ("chat", '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}'),
    ],
)
def test_a_valid_line_with_extra_fields_is_accepted(kind: str, line: str) -> None:
    encoder = DocumentEncoder(load_tokenizer_folder(EXAMPLE_TOKENIZER), kind)  # type: ignore[arg-type]
    (document,) = encoder.encode([encoder.parse(line)])
    assert not isinstance(document, BadLineError) and len(document.ids) > 1
