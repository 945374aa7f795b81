"""From JSONL lines to token documents: validation, rendering, tokenisation and the loss mask.

The end-of-document rule:

- ``pretrain``: a line ``{"text": "..."}`` becomes ``encode(text, add_special_tokens=True)`` (what
  ``tokenizer(text)`` gives in transformers, so a tokenizer whose post-processor adds a BOS keeps it) followed by
  the tokenizer's ``eos_token`` (not doubled when the post-processor already ends with it). Every token is a
  loss token.
- ``chat``: a line ``{"messages": [{"role", "content"}, ...]}`` becomes exactly the ids of
  ``apply_chat_template(messages, tokenize=True)`` (rendered without a generation prompt, encoded without added
  special tokens): the template decides how a conversation ends (``<|im_end|>\\n`` in ChatML), nothing is
  appended. A token is a loss token when it overlaps an assistant span (see :mod:`xtrain.data.chat_template`),
  the rule of transformers' ``return_assistant_tokens_mask``.

A line that cannot become a document raises :class:`BadLineError` with the reason; the cache builder counts and
skips it.
"""

import json
from dataclasses import dataclass
from typing import Any, Literal

import jinja2
import numpy as np
import numpy.typing as npt

from xtrain.data.chat_template import ChatRenderer, ChatTemplateError, RenderedChat
from xtrain.data.tokenizer import TokenizerFolder
from xtrain.errors import DataError

CHAT_ROLES = frozenset({"system", "user", "assistant", "tool"})
"""Roles a chat message may have; any other is a bad line."""

TokenArray = npt.NDArray[np.uint32]
MaskArray = npt.NDArray[np.uint8]


class BadLineError(ValueError):
    """A JSONL line that is not a usable document; the message is the reason."""


@dataclass(frozen=True)
class Document:
    """One tokenised document: its ids and, for chat, which ids carry loss (1) or not (0)."""

    ids: TokenArray
    loss_mask: MaskArray | None


class DocumentEncoder:
    """Turns the raw lines of one data kind into documents with one tokenizer folder."""

    def __init__(self, folder: TokenizerFolder, kind: Literal["pretrain", "chat"]) -> None:
        self.folder = folder
        self.kind = kind
        self._eos_id = folder.token_id("eos_token")
        self._renderer: ChatRenderer | None = None
        config_file = folder.path / "tokenizer_config.json"
        if kind == "pretrain" and self._eos_id is None:
            raise DataError(f"{config_file}: no eos_token, which ends every pretraining document")
        if kind == "chat":
            if folder.chat_template is None:
                raise DataError(f"{config_file}: no chat_template, which data.kind = 'chat' needs")
            try:
                self._renderer = ChatRenderer(folder.chat_template, folder.special_tokens)
            except jinja2.exceptions.TemplateSyntaxError as error:
                raise DataError(f"{config_file}: chat_template line {error.lineno}: {error.message}") from None

    def parse(self, raw: bytes | str) -> str | RenderedChat:
        """Validate one line: the text to tokenise (pretrain) or the rendered conversation (chat)."""
        try:
            record = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise BadLineError(f"invalid JSON ({error})") from None
        if not isinstance(record, dict):
            raise BadLineError(f"expected a JSON object, got {type(record).__name__}")
        if self._renderer is None:
            return _pretrain_text(record)
        messages = _chat_messages(record)
        try:
            return self._renderer.render_with_assistant_spans(messages)
        except ChatTemplateError as error:
            raise BadLineError(str(error)) from None

    def encode(self, parsed: list[str | RenderedChat]) -> list[Document | BadLineError]:
        """Tokenise a batch of parsed lines (one call into the tokenizer, which uses its own threads)."""
        tokenizer = self.folder.tokenizer
        if self._renderer is None:
            texts = [item for item in parsed if isinstance(item, str)]
            documents: list[Document | BadLineError] = []
            for encoding in tokenizer.encode_batch(texts, add_special_tokens=True):
                ids = list(encoding.ids)
                if not ids or ids[-1] != self._eos_id:
                    ids.append(int(self._eos_id))  # type: ignore[arg-type]  # checked in __init__
                documents.append(Document(np.asarray(ids, dtype=np.uint32), None))
            return documents
        chats = [item for item in parsed if isinstance(item, RenderedChat)]
        encodings = tokenizer.encode_batch([chat.text for chat in chats], add_special_tokens=False)
        return [
            _chat_document(chat, encoding.ids, encoding.offsets)
            for chat, encoding in zip(chats, encodings, strict=True)
        ]


def _pretrain_text(record: dict[str, Any]) -> str:
    if "text" not in record:
        raise BadLineError('missing field "text"')
    text = record["text"]
    if not isinstance(text, str):
        raise BadLineError(f'"text" must be a string, got {type(text).__name__}')
    if not text.strip():
        raise BadLineError('empty "text"')
    return text


def _chat_messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    if "messages" not in record:
        raise BadLineError('missing field "messages"')
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise BadLineError('"messages" must be a non-empty list')
    cleaned = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadLineError(f"message {index} is not an object")
        for field in ("role", "content"):
            if field not in message:
                raise BadLineError(f'message {index} has no "{field}"')
        role, content = message["role"], message["content"]
        if role not in CHAT_ROLES:
            raise BadLineError(f"message {index} has unknown role {role!r} (known: {', '.join(sorted(CHAT_ROLES))})")
        if not isinstance(content, str):
            raise BadLineError(f'message {index} "content" must be a string, got {type(content).__name__}')
        # transformers drops keys whose value is None before rendering; so do we.
        cleaned.append({key: value for key, value in message.items() if value is not None})
    if not any(message["role"] == "assistant" for message in cleaned):
        raise BadLineError("no assistant message (a chat document needs one to carry loss)")
    return cleaned


def _chat_document(chat: RenderedChat, ids: list[int], offsets: list[tuple[int, int]]) -> Document | BadLineError:
    mask = np.zeros(len(ids), dtype=np.uint8)
    spans = chat.assistant_spans
    span_index = 0
    # A token is an assistant token when its characters overlap a span; both lists are in order: one pass.
    for token_index, (start, end) in enumerate(offsets):
        while span_index < len(spans) and start >= spans[span_index][1]:
            span_index += 1
        if span_index == len(spans):
            break
        if end > spans[span_index][0]:
            mask[token_index] = 1
    if not mask.any():
        return BadLineError("no assistant tokens after rendering (empty assistant replies?)")
    return Document(np.asarray(ids, dtype=np.uint32), mask)
