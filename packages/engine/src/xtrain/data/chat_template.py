"""Render chat conversations with a tokenizer folder's Jinja chat template, the way Hugging Face applies it.

transformers renders ``chat_template`` in an immutable sandboxed Jinja environment with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, a ``{% generation %}`` block tag that marks assistant text,
a ``raise_exception(message)`` global, a ``tojson`` filter that does not escape HTML, a ``strftime_now(format)``
global, and the tokenizer's named special tokens (``bos_token``, ``eos_token``, ...) as variables, with
``messages``, ``tools=None``, ``documents=None`` and ``add_generation_prompt``. A message's reasoning, under any
of the names ``reasoning_content``, ``thinking`` and ``reasoning``, is also given under ``reasoning_content`` and
``thinking`` (templates read one or the other). This module builds the same environment (its own code) so the
text, and therefore the tokens, match ``apply_chat_template``.

Assistant spans (the characters that carry loss):

- a template with ``{% generation %}...{% endgeneration %}`` marks them itself (transformers'
  ``return_assistant_tokens_mask`` reads the same marks);
- otherwise, for each assistant message i, the span is what rendering ``messages[:i+1]`` adds to rendering
  ``messages[:i]`` with ``add_generation_prompt=True``: the reply and whatever closes it (``<|im_end|>\\n`` in
  ChatML). This needs a template that renders a prefix of the conversation as a prefix of the text; one that
  does not (it rewrites earlier turns) is refused with a message asking for ``{% generation %}`` marks.
"""

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

Message = Mapping[str, Any]

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
"""Names a message's reasoning goes by; transformers fills ``thinking`` and ``reasoning_content`` from the first set."""
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
# While a render that wants assistant spans runs: the text yielded so far and the spans found.
_SPAN_TRACKING: ContextVar[tuple[list[str], list[tuple[int, int]]] | None] = ContextVar(
    "xtrain_chat_spans", default=None
)


class ChatTemplateError(ValueError):
    """The template refused a conversation (``raise_exception``) or failed while rendering it."""


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}body{% endgeneration %}``: renders the body and, when tracking, records its span."""

    tags = {"generation"}  # noqa: RUF012 (jinja2's Extension declares this as a class attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        text = str(caller())
        tracking = _SPAN_TRACKING.get()
        if tracking is not None:
            # Jinja yields the text before this block first, so its length is where the block starts.
            start = sum(len(block) for block in tracking[0])
            tracking[1].append((start, start + len(text)))
        return text


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Jinja's own tojson escapes <, >, & for HTML; chat templates want the plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format_string: str) -> str:
    return datetime.now().strftime(format_string)


@dataclass(frozen=True)
class RenderedChat:
    """A rendered conversation and the character spans of its assistant text."""

    text: str
    assistant_spans: tuple[tuple[int, int], ...]


class ChatRenderer:
    """One compiled chat template with its special-token variables."""

    def __init__(self, template: str, special_tokens: Mapping[str, str]) -> None:
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
        )
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = _strftime_now
        # A TemplateSyntaxError escapes to the caller, which names the tokenizer_config.json it came from.
        self._template = environment.from_string(template)
        self._special_tokens = dict(special_tokens)
        self.marks_generation = _GENERATION_TAG.search(template) is not None

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = False) -> str:
        """The text ``apply_chat_template(messages, tokenize=False)`` produces."""
        return "".join(self._generate(messages, add_generation_prompt))

    def render_with_assistant_spans(self, messages: Sequence[Message]) -> RenderedChat:
        """The full conversation (no generation prompt) and where its assistant text lies."""
        if self.marks_generation:
            blocks: list[str] = []
            spans: list[tuple[int, int]] = []
            with _tracking(blocks, spans):
                for block in self._generate(messages, add_generation_prompt=False):
                    blocks.append(block)  # one at a time: a {% generation %} block reads how much came before
            return RenderedChat("".join(blocks), tuple(spans))
        text = self.render(messages)
        prefix_spans = []
        for index, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            before = self.render(messages[:index], add_generation_prompt=True)
            through = self.render(messages[: index + 1])
            if not (text.startswith(through) and through.startswith(before)):
                raise ChatTemplateError(
                    "the chat template does not render a conversation's prefix as a prefix of its text, so the "
                    "assistant tokens cannot be found; mark them with {% generation %}...{% endgeneration %}"
                )
            prefix_spans.append((len(before), len(through)))
        return RenderedChat(text, tuple(prefix_spans))

    def _generate(self, messages: Sequence[Message], add_generation_prompt: bool) -> Iterator[str]:
        variables = {
            **self._special_tokens,
            "messages": [_with_reasoning_aliases(message) for message in messages],
            "tools": None,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            yield from self._template.generate(**variables)
        except jinja2.exceptions.TemplateError as error:
            raise ChatTemplateError(f"chat template: {error}") from None


def _with_reasoning_aliases(message: Message) -> dict[str, Any]:
    reasoning = next((message[key] for key in REASONING_FIELDS if message.get(key) is not None), None)
    if reasoning is None:
        return dict(message)
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


@contextmanager
def _tracking(blocks: list[str], spans: list[tuple[int, int]]) -> Iterator[None]:
    token = _SPAN_TRACKING.set((blocks, spans))
    try:
        yield
    finally:
        _SPAN_TRACKING.reset(token)
