"""JSON Lines files that other processes are still appending to.

The writer appends one JSON object and its newline per write, so a reader can only ever see a partly written LAST
line. Both readers here treat it the same way: a final line without its newline is not a record yet (never an
error), and it is returned as soon as it is complete. A corrupt line in the middle of a file is a real error and
raises TraceInputError with the file and the 1-based line number.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import orjson

from deeptrace.errors import TraceInputError

_READ_CHUNK = 1 << 20

T = TypeVar("T")
LineParser = Callable[[Path, int, bytes], T]
"""(file, 1-based line number, the line's bytes) -> a record, or TraceInputError naming the file and line."""


def parse_json_line(path: Path, line_no: int, raw: bytes) -> dict[str, Any]:
    """One line as a JSON object, or TraceInputError naming the file and the line."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise TraceInputError(path, f"invalid JSON line ({exc})", line=line_no) from None
    if not isinstance(obj, dict):
        raise TraceInputError(path, f"expected a JSON object per line, found {type(obj).__name__}", line=line_no)
    return obj


class RecordFollower(Generic[T]):
    """Follow a growing JSON Lines file: each `poll()` returns the records completed since the previous one, each
    made from its line by `parse` (a typed record's `from_line`).

    The file may not exist yet (poll returns []). Only newline-terminated lines count, so a half-written last line
    is picked up by a later poll once its writer finishes it, never lost and never raised on. A corrupt complete
    line raises TraceInputError (with its line number) once: records before it are returned first, by the poll
    that reaches it; the poll after that raises; the next ones continue after the bad line. If the file shrinks
    (it was replaced), following restarts from its beginning.
    """

    def __init__(self, path: Path | str, parse: LineParser[T]) -> None:
        self.path = Path(path)
        self._parse = parse
        self._offset = 0  # byte offset of the first line not yet returned
        self._line_no = 0  # number of complete lines consumed so far
        self._pending_error: TraceInputError | None = None

    @property
    def lines_read(self) -> int:
        return self._line_no

    def poll(self) -> list[T]:
        if self._pending_error is not None:
            error, self._pending_error = self._pending_error, None
            raise error
        try:
            with self.path.open("rb") as handle:
                size = handle.seek(0, 2)
                if size < self._offset:
                    self._offset, self._line_no = 0, 0
                handle.seek(self._offset)
                data = handle.read(size - self._offset)
        except FileNotFoundError:
            return []
        records: list[T] = []
        end = data.rfind(b"\n")
        if end < 0:
            return records
        position = 0
        while position <= end:
            newline = data.index(b"\n", position)
            raw = data[position:newline]
            line_no = self._line_no + 1
            if raw.strip():
                try:
                    records.append(self._parse(self.path, line_no, raw))
                except TraceInputError as error:
                    # Consume the bad line now; report it after the records that precede it are delivered.
                    self._advance(newline + 1 - position)
                    if records:
                        self._pending_error = error
                        return records
                    raise
            self._advance(newline + 1 - position)
            position = newline + 1
        return records

    def _advance(self, nbytes: int) -> None:
        self._offset += nbytes
        self._line_no += 1


class JsonlFollower(RecordFollower[dict[str, Any]]):
    """A `RecordFollower` of plain JSON objects."""

    def __init__(self, path: Path | str) -> None:
        super().__init__(path, parse_json_line)


def read_jsonl(path: Path | str, *, missing_ok: bool = False) -> list[dict[str, Any]]:
    """All objects of a JSON Lines file (see `read_records`)."""
    return read_records(path, parse_json_line, missing_ok=missing_ok)


def read_records(path: Path | str, parse: LineParser[T], *, missing_ok: bool = False) -> list[T]:
    """All records of a JSON Lines file, each made from its line by `parse`.

    A half-written last line (no newline, not valid JSON) is ignored; a last line that lacks only its newline but
    parses is a record. A corrupt line anywhere else raises TraceInputError with its line number.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if missing_ok:
            return []
        raise TraceInputError(path, "file not found") from None
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    records = [parse(path, number, raw) for number, raw in enumerate(lines, start=1) if raw.strip()]
    if tail.strip():
        with contextlib.suppress(TraceInputError):  # else the writer is in the middle of this line
            records.append(parse(path, len(lines) + 1, tail))
    return records
