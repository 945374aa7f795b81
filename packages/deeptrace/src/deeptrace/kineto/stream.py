"""Streaming reader of one Chrome-trace JSON document: yields the events of `traceEvents` one at a time.

Memory stays bounded by the chunk size and the largest single event, whatever the file size: the document is read
in chunks (through gzip when the name ends in .gz), the top-level object is walked key by key, and the elements of
the `traceEvents` array are decoded with orjson, a buffer's worth of events per call (see `_batch`), falling back
to the C scanner of the standard `json` module (`JSONDecoder.raw_decode`) one event at a time where a batch does
not parse. Top-level keys other than `traceEvents` (Kineto's metadata: schemaVersion, distributedInfo,
deviceProperties, baseTimeNanoseconds, ...) are small and are kept in `metadata`, in whichever order they come.

Every problem (not JSON, truncated file, not a trace) becomes one TraceInputError naming the file and line. With
`allow_cut`, a plain JSON file that simply stops inside `traceEvents` (the profiler's process died while writing
it) yields the events before the cut and sets `cut` to say so, instead of raising.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from deeptrace.errors import TraceInputError

CHUNK_CHARS = 1 << 20
# An event bigger than this is not an event: stop reading instead of buffering the rest of the file.
MAX_VALUE_CHARS = 64 << 20
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_WHITESPACE_CHARS = " \t\n\r"
SLOW_AFTER_FAILED_BATCH = 256
_DECODER = json.JSONDecoder()


def open_binary(path: Path) -> BinaryIO:
    """The file's bytes, decompressed when it is gzip (by name or by magic number)."""
    raw = path.open("rb")
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]  # GzipFile is a BinaryIO
    return raw


class _EndsEarlyError(TraceInputError):
    """The document stops before its end: the rest of the file was never written."""


class TraceEventStream:
    """Iterate `events()` once; afterwards `metadata` holds every other top-level key of the document, and `cut`
    (with `allow_cut`) says where a file cut off inside traceEvents stopped, or is None."""

    def __init__(self, path: Path, chunk_chars: int = CHUNK_CHARS, *, allow_cut: bool = False) -> None:
        self.path = path
        self.allow_cut = allow_cut
        self.cut: str | None = None
        self.metadata: dict[str, Any] = {}
        self.has_trace_events = False
        self.events_read = 0
        self._chunk = chunk_chars
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._lines_before = 0  # newlines in the part of the document already dropped from the buffer
        self._text: io.TextIOWrapper | None = None

    # --- buffer management -------------------------------------------------------------------------------------
    def _fill(self) -> bool:
        """Append one chunk to the buffer; False at the end of the file."""
        if self._eof or self._text is None:
            return False
        try:
            data = self._text.read(self._chunk)
        except (EOFError, zlib.error, gzip.BadGzipFile) as err:
            raise self._error(f"truncated or corrupt gzip data after {self.events_read} events ({err})") from None
        except UnicodeDecodeError:
            raise self._error("not UTF-8 text (is this a trace file?)") from None
        except OSError as err:
            raise self._error(f"cannot read ({err})") from None
        if not data:
            self._eof = True
            return False
        if self._pos > len(self._buf) // 2:
            self._lines_before += self._buf.count("\n", 0, self._pos)
            self._buf = self._buf[self._pos :]
            self._pos = 0
        self._buf += data
        return True

    def _error(self, problem: str, pos: int | None = None) -> TraceInputError:
        return TraceInputError(self.path, problem, None if pos is None else self._line(pos))

    def _line(self, pos: int) -> int:
        return self._lines_before + self._buf.count("\n", 0, pos) + 1

    def _peek(self) -> str:
        """Skip whitespace and return the next character ('' at the end of the file)."""
        while True:
            self._pos = _WHITESPACE.match(self._buf, self._pos).end()  # type: ignore[union-attr]  # always matches
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                return ""

    def _expect(self, allowed: str, what: str) -> str:
        char = self._peek()
        if char == "" or char not in allowed:
            if char == "":
                raise _EndsEarlyError(
                    self.path, f"the file ends early, expected {what} (truncated?)", self._line(self._pos)
                )
            raise self._error(f"invalid JSON: expected {what}, found {char!r}", self._pos)
        self._pos += 1
        return char

    def _value(self) -> Any:
        """Decode one JSON value at the current position, reading more of the file while it is incomplete."""
        self._peek()
        last_failure: tuple[int, str] | None = None
        while True:
            try:
                value, end = _DECODER.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as err:
                # An error this close to the end of the buffer may just be a value cut by the chunk boundary.
                at_buffer_end = err.pos >= len(self._buf) - 16 or err.msg.startswith("Unterminated string")
                same_again = last_failure == (err.pos - self._pos, err.msg)
                if (not at_buffer_end and same_again) or len(self._buf) - self._pos > MAX_VALUE_CHARS:
                    raise self._error(f"invalid JSON: {err.msg}", err.pos) from None
                last_failure = (err.pos - self._pos, err.msg)
                start = self._pos
                if not self._fill():
                    if at_buffer_end:
                        raise _EndsEarlyError(
                            self.path,
                            f"the file ends inside a JSON value after {self.events_read} events (truncated?)",
                            self._line(start),
                        ) from None
                    raise self._error(f"invalid JSON: {err.msg}", err.pos) from None
                continue
            if end >= len(self._buf) and not self._eof and self._fill():
                continue  # a number cut at the chunk boundary decodes, wrongly, as a shorter number
            self._pos = end
            return value

    # --- the document ------------------------------------------------------------------------------------------
    def events(self) -> Iterator[Any]:
        with open_binary(self.path) as binary:
            self._text = io.TextIOWrapper(binary, encoding="utf-8")
            first = self._peek()
            if first == "":
                raise TraceInputError(self.path, "empty file")
            if first != "{":
                raise self._error("not a trace: the document is not a JSON object with traceEvents", self._pos)
            self._pos += 1
            if self._peek() == "}":
                self._pos += 1
            else:
                while True:
                    if self._peek() != '"':
                        raise self._error("invalid JSON: expected a key", self._pos)
                    key = self._value()
                    self._expect(":", "':'")
                    if key == "traceEvents" and self._peek() == "[":
                        self.has_trace_events = True
                        yield from self._array_elements()
                        if self.cut is not None:
                            return
                    else:
                        self.metadata[key] = self._value()
                    if self._expect(",}", "',' or '}'") == "}":
                        break
            if self._peek() != "":
                raise self._error("invalid JSON: extra data after the end of the document", self._pos)

    def _array_elements(self) -> Iterator[Any]:
        try:
            yield from self._array_elements_to_the_end()
        except _EndsEarlyError as error:
            if not self.allow_cut:
                raise
            self.cut = (
                f"cut off inside traceEvents at line {error.line} (the file ends there: the profiler died while"
                f" writing it); read the {self.events_read} whole events before the cut, and none of the keys after"
                " traceEvents"
            )

    def _array_elements_to_the_end(self) -> Iterator[Any]:
        self._pos += 1  # the '['
        if self._peek() == "]":
            self._pos += 1
            return
        slow_left = 0  # after a failed batch, this many events go one by one before batching again
        while True:
            batch = self._batch() if slow_left == 0 else None
            if batch is None:
                slow_left = max(0, slow_left - 1) if slow_left else SLOW_AFTER_FAILED_BATCH
                yield self._value()
                self.events_read += 1
            else:
                self.events_read += len(batch)
                yield from batch
            if self._expect(",]", "',' or ']' in traceEvents") == "]":
                return

    def _batch(self) -> list[Any] | None:
        """Decode, in one orjson call, every complete event from the current position to the last one in the
        buffer. The cut is a '}' followed by ',' and '{' (between two events, if anywhere); a cut that is not
        between two top-level events cannot parse as a list, so a successful parse proves the cut right. None when
        there is no such cut or the text does not parse (the caller then decodes one event with the exact path)."""
        if len(self._buf) - self._pos < self._chunk // 2 and not self._eof:
            self._fill()
        buf, start = self._buf, self._pos
        # A quarter chunk of text per call: decoded events take several times their text's size in memory.
        end = min(len(buf), start + max(self._chunk // 4, 256))
        for _ in range(32):
            comma = buf.rfind(",", start, end)
            if comma < 0:
                return None
            before = comma - 1
            while before > start and buf[before] in _WHITESPACE_CHARS:
                before -= 1
            after = comma + 1
            while after < len(buf) and buf[after] in _WHITESPACE_CHARS:
                after += 1
            if buf[before] == "}" and after < len(buf) and buf[after] == "{":
                try:
                    events = orjson.loads("[" + buf[start : before + 1] + "]")
                except orjson.JSONDecodeError:
                    return None
                self._pos = before + 1
                return events  # type: ignore[no-any-return]  # orjson.loads returns Any
            end = comma
        return None
