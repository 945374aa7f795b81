"""JSON Lines files that other processes are still appending to, or that a dead writer left cut off.

The writer appends one JSON object and its newline per write, so a reader of a live file can only ever see a
partly written LAST line: it is not a record yet (never an error), and it is returned as soon as it is complete.
A writer that died mid-line (a node that went down) leaves such a line for good; then the file is **cut off**:
the readers read it up to its last whole record and say so with a `CutOffError` naming the file and the line
(`read_records` collects them when given a list; a follower raises one once the file has not changed for
`CUT_AFTER_S`). When a later writer appended to a cut file (a restarted job), the cut record and the next whole
one share a line; the whole one is read, and the cut is named the same way. Any other corrupt line is a real
error and raises TraceInputError with the file and the 1-based line number.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import orjson

from deeptrace.errors import CutOffError, TraceInputError

CUT_AFTER_S = 10.0
"""A partial last line unchanged for this long is a cut-off file, not a record being written: a writer writes a
line in one call, so a live one never leaves a line half-written for more than a moment."""

T = TypeVar("T")
LineParser = Callable[[Path, int, bytes], T]
"""(file, 1-based line number, the line's bytes) -> a record, or TraceInputError naming the file and line."""


def cut_at_end(path: Path, line: int, nbytes: int) -> CutOffError:
    return CutOffError(
        path,
        f"cut off inside this line ({nbytes} bytes of a record its writer never finished: it died mid-line);"
        " read the whole records before it",
        line=line,
    )


def cut_and_glued(path: Path, line: int, nbytes: int) -> CutOffError:
    return CutOffError(
        path,
        f"cut off mid-line ({nbytes} bytes of a record its writer never finished: it died mid-line), and a later"
        " writer appended a whole record after the cut; read the whole one",
        line=line,
    )


def parse_json_line(path: Path, line_no: int, raw: bytes) -> dict[str, Any]:
    """One line as a JSON object, or TraceInputError naming the file and the line."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise TraceInputError(path, f"invalid JSON line ({exc})", line=line_no) from None
    if not isinstance(obj, dict):
        raise TraceInputError(path, f"expected a JSON object per line, found {type(obj).__name__}", line=line_no)
    return obj


def _parse_line(path: Path, line_no: int, raw: bytes, parse: LineParser[T]) -> tuple[T, CutOffError | None]:
    """A complete line's record; for a line that is a cut record with a whole one glued after it, the whole one
    and the cut. Anything else that does not parse raises the parser's TraceInputError."""
    try:
        return parse(path, line_no, raw), None
    except TraceInputError as error:
        glued = _glued_record(raw)
        if glued is None:
            raise
        try:
            return parse(path, line_no, raw[glued:]), cut_and_glued(path, line_no, glued)
        except TraceInputError:
            raise error from None


def _glued_record(raw: bytes) -> int | None:
    """Where a whole JSON object starts that runs to the end of `raw`, after an unfinished one (a writer that died
    mid-line, then another that appended after it); None when `raw` is not that."""
    start = raw.find(b"{", 1)
    while start > 0:
        try:
            obj = orjson.loads(raw[start:])
        except orjson.JSONDecodeError:
            start = raw.find(b"{", start + 1)
            continue
        return start if isinstance(obj, dict) and raw.lstrip().startswith(b"{") else None
    return None


class RecordFollower(Generic[T]):
    """Follow a growing JSON Lines file: each `poll()` returns the records completed since the previous one, each
    made from its line by `parse` (a typed record's `from_line`).

    The file may not exist yet (poll returns []). Only newline-terminated lines count, so a half-written last line
    is picked up by a later poll once its writer finishes it, never lost. A file whose last line stays unfinished
    for `cut_after_s` was cut off (its writer died): a last line that parses is then a record; one that does not
    makes each poll without new records raise a `CutOffError` naming the file and line, until the file grows. A
    corrupt complete line raises TraceInputError (with its line number) once: records before it are returned
    first, by the poll that reaches it; the poll after that raises; the next ones continue after the bad line. A
    cut record with a whole one glued after it is read as that whole record, and the `CutOffError` is raised once,
    by the next poll. If the file shrinks (it was replaced), following restarts from its beginning.
    """

    def __init__(self, path: Path | str, parse: LineParser[T], cut_after_s: float = CUT_AFTER_S) -> None:
        self.path = Path(path)
        self._parse = parse
        self._cut_after_s = cut_after_s
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
                stat = os.fstat(handle.fileno())
                size = stat.st_size
                if size < self._offset:
                    self._offset, self._line_no = 0, 0
                handle.seek(self._offset)
                data = handle.read(size - self._offset)
        except FileNotFoundError:
            return []
        records: list[T] = []
        end = data.rfind(b"\n")
        position = 0
        while position <= end:
            newline = data.index(b"\n", position)
            raw = data[position:newline]
            line_no = self._line_no + 1
            if raw.strip():
                try:
                    record, cut = _parse_line(self.path, line_no, raw, self._parse)
                except TraceInputError as error:
                    # Consume the bad line now; report it after the records that precede it are delivered.
                    self._advance(newline + 1 - position)
                    if records:
                        self._pending_error = error
                        return records
                    raise
                records.append(record)
                if cut is not None and self._pending_error is None:
                    self._pending_error = cut
            self._advance(newline + 1 - position)
            position = newline + 1
        tail = data[position:]
        if tail.strip() and time.time() - stat.st_mtime >= self._cut_after_s:
            self._cut_tail(tail, records)
        return records

    def _cut_tail(self, tail: bytes, records: list[T]) -> None:
        """The file ends in a line its writer left unfinished long ago: a record if it parses, else a CutOffError
        (raised by a poll that has nothing else to return)."""
        line_no = self._line_no + 1
        try:
            record, _ = _parse_line(self.path, line_no, tail, self._parse)
        except TraceInputError:
            if not records and self._pending_error is None:
                raise cut_at_end(self.path, line_no, len(tail)) from None
            return
        records.append(record)
        self._advance(len(tail))

    def _advance(self, nbytes: int) -> None:
        self._offset += nbytes
        self._line_no += 1


class JsonlFollower(RecordFollower[dict[str, Any]]):
    """A `RecordFollower` of plain JSON objects."""

    def __init__(self, path: Path | str, cut_after_s: float = CUT_AFTER_S) -> None:
        super().__init__(path, parse_json_line, cut_after_s)


def read_jsonl(
    path: Path | str, *, missing_ok: bool = False, cuts: list[CutOffError] | None = None
) -> list[dict[str, Any]]:
    """All objects of a JSON Lines file (see `read_records`)."""
    return read_records(path, parse_json_line, missing_ok=missing_ok, cuts=cuts)


def read_records(
    path: Path | str, parse: LineParser[T], *, missing_ok: bool = False, cuts: list[CutOffError] | None = None
) -> list[T]:
    """All records of a JSON Lines file, each made from its line by `parse`.

    A half-written last line (no newline, not valid JSON: being written, or cut off by a writer that died) is not
    a record; a last line that lacks only its newline but parses is one. A cut record with a whole one glued after
    it is read as the whole one. Pass `cuts` to collect a `CutOffError` for each place the file was cut (a live
    writer's unfinished last line counts too: the reader cannot tell the two apart at one look). A corrupt line
    anywhere else raises TraceInputError with its line number.
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
    records: list[T] = []
    for number, raw in enumerate(lines, start=1):
        if raw.strip():
            record, cut = _parse_line(path, number, raw, parse)
            records.append(record)
            if cut is not None and cuts is not None:
                cuts.append(cut)
    if tail.strip():
        try:
            record, cut = _parse_line(path, len(lines) + 1, tail, parse)
        except TraceInputError:  # the writer is in the middle of this line, or died there
            cut = cut_at_end(path, len(lines) + 1, len(tail))
        else:
            records.append(record)
        if cut is not None and cuts is not None:
            cuts.append(cut)
    return records


@dataclass(frozen=True)
class RecordsScan(Generic[T]):
    """What `scan_records` found: the whole records, the last of them, and where the file was cut."""

    records: int
    last: T | None
    cuts: list[CutOffError] = field(default_factory=list)


def scan_records(path: Path | str, parse: LineParser[T], record_start: bytes) -> RecordsScan[T]:
    """The number of whole records of a JSON Lines file, its last record and its cuts, as `read_records` gives
    them, at the cost of counting its lines: only the last line and a line holding two record starts (a cut
    record with a whole one glued after it: then the whole file is read) are parsed; the others are not
    validated. `record_start` is how every record begins (its first key). Raises TraceInputError for a missing
    file, or a last line that does not parse although it is complete."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceInputError(path, "file not found") from None
    end = data.rfind(b"\n") + 1
    lines = data.count(b"\n", 0, end)
    tail = data[end:]
    blank = data.count(b"\n\n", 0, end) + int(data.startswith(b"\n"))
    if data.count(record_start) > lines - blank + int(bool(tail.strip())):
        cuts: list[CutOffError] = []
        whole = read_records(path, parse, cuts=cuts)
        return RecordsScan(len(whole), whole[-1] if whole else None, cuts)
    records = lines - blank
    last: T | None = None
    cut: CutOffError | None = None
    if tail.strip():
        try:
            last, cut = _parse_line(path, lines + 1, tail, parse)
        except TraceInputError:
            cut = cut_at_end(path, lines + 1, len(tail))
        else:
            records += 1  # a last line that lacks only its newline
    if last is None and records:
        start = data.rfind(b"\n", 0, end - 1) + 1
        while not data[start : end - 1].strip():  # blank last lines: the record before them
            end = start
            start = data.rfind(b"\n", 0, end - 1) + 1
        last = _parse_line(path, data.count(b"\n", 0, start) + 1, data[start : end - 1], parse)[0]
    return RecordsScan(records, last, [cut] if cut is not None else [])
