"""Reading trace/rank-{R}.dtr back into Spans, streaming, with memory bounded by one read chunk."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO

from deeptrace.collect import trace_format as fmt
from deeptrace.errors import TraceInputError
from deeptrace.rundir import layout
from deeptrace.rundir.readers import read_rank_clock
from deeptrace.rundir.records import RankClock
from deeptrace.spans import Span

_CHUNK = 1 << 20


class TraceReader(Iterator[Span]):
    """Iterates the Spans of one rank's trace file; `rank`, `world_size` and `clock` describe it.

    `clock` is the rank's clock reference from the file beside the trace (None if that file is missing or
    unreadable; `clock_error` then says why). After iteration, `torn_bytes` is the size of a partial final record
    (a writer killed mid-write), which is ignored.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._handle: IO[bytes] = path.open("rb")
        except FileNotFoundError:
            raise TraceInputError(path, "file not found") from None
        try:
            self.rank, self.world_size, self.header_size = _read_header(path, self._handle.read(fmt.HEADER.size))
        except TraceInputError:
            self._handle.close()
            raise
        self._handle.seek(self.header_size)
        self._offset = self.header_size  # file offset of self._buffer[0]
        self._buffer = b""
        self._position = 0
        self._eof = False
        self._strings: dict[int, str] = {}
        self.torn_bytes = 0
        self.spans_read = 0
        self.clock: RankClock | None = None
        self.clock_error: TraceInputError | None = None
        try:
            self.clock = read_rank_clock(path.parent.parent, self.rank)
        except TraceInputError as error:
            self.clock_error = error

    def __iter__(self) -> TraceReader:
        return self

    def _ensure(self, nbytes: int) -> bool:
        """Make `nbytes` available from the current position; False at end of file."""
        while len(self._buffer) - self._position < nbytes:
            if self._eof:
                return False
            chunk = self._handle.read(_CHUNK)
            if not chunk:
                self._eof = True
                continue
            self._offset += self._position
            self._buffer = self._buffer[self._position :] + chunk
            self._position = 0
        return True

    def _string(self, string_id: int) -> str:
        try:
            return self._strings[string_id]
        except KeyError:
            raise TraceInputError(
                self.path, f"span at byte {self._offset + self._position} uses undefined string id {string_id}"
            ) from None

    def __next__(self) -> Span:
        while True:
            if not self._ensure(1):
                self._finish()
                raise StopIteration
            tag = self._buffer[self._position]
            if tag == fmt.TAG_SPAN:
                if not self._ensure(fmt.SPAN.size):
                    self._finish(torn=True)
                    raise StopIteration
                (_, code, name, track, group, start, end, step, layer, seq, nbytes) = fmt.SPAN.unpack_from(
                    self._buffer, self._position
                )
                category = fmt.CATEGORY_OF_CODE.get(code)
                if category is None:
                    raise self._corrupt(f"unknown category code {code}")
                span = Span(
                    name=self._string(name),
                    category=category,
                    start_ns=start,
                    end_ns=end,
                    track=self._string(track),
                    step=None if step == fmt.NONE_I64 else step,
                    layer=None if layer == fmt.NONE_I32 else layer,
                    nbytes=None if nbytes == fmt.NONE_I64 else nbytes,
                    group=None if group == fmt.NO_STRING else self._string(group),
                    seq=None if seq == fmt.NONE_I64 else seq,
                )
                self._position += fmt.SPAN.size
                self.spans_read += 1
                return span
            if tag == fmt.TAG_STRING:
                if not self._ensure(fmt.STRING_HEAD.size):
                    self._finish(torn=True)
                    raise StopIteration
                _, string_id, length = fmt.STRING_HEAD.unpack_from(self._buffer, self._position)
                if not self._ensure(fmt.STRING_HEAD.size + length):
                    self._finish(torn=True)
                    raise StopIteration
                start = self._position + fmt.STRING_HEAD.size
                try:
                    self._strings[string_id] = self._buffer[start : start + length].decode()
                except UnicodeDecodeError:
                    raise self._corrupt("string record is not valid UTF-8") from None
                self._position = start + length
                continue
            raise self._corrupt(f"unknown record tag {tag}")

    def _corrupt(self, problem: str) -> TraceInputError:
        self._handle.close()
        return TraceInputError(
            self.path, f"corrupt trace at byte {self._offset + self._position}: {problem} (spans before it are valid)"
        )

    def _finish(self, *, torn: bool = False) -> None:
        if torn:
            self.torn_bytes = len(self._buffer) - self._position
        self._handle.close()

    def close(self) -> None:
        self._handle.close()


def _read_header(path: Path, head: bytes) -> tuple[int, int, int]:
    """(rank, world size, header size) from a trace's first bytes, or why they are not a trace header."""
    if not head:
        raise TraceInputError(path, "empty file: the collector died before writing the trace header")
    if head[: len(fmt.MAGIC)] != fmt.MAGIC[: len(head)]:
        raise TraceInputError(path, "not a deeptrace trace (its first bytes are not the DEEPTRC magic)")
    if len(head) < fmt.HEADER.size:
        raise TraceInputError(path, "truncated header: the file ends inside the trace header")
    _, version, header_size, rank, world_size = fmt.HEADER.unpack(head)
    if version > fmt.TRACE_FORMAT_VERSION:
        raise TraceInputError(
            path, f"trace format version {version} is newer than this deeptrace reads; upgrade deeptrace"
        )
    return rank, world_size, header_size


def read_trace(path: Path | str) -> TraceReader:
    """Open one rank's collector trace: iterate it for Spans; `.rank`, `.world_size`, `.clock` describe it.

    Raises TraceInputError (naming the file) at once for a missing, empty or foreign file, and during iteration
    for corruption in the middle; a torn final record is ignored.
    """
    return TraceReader(Path(path))


def trace_paths(run_dir: Path | str) -> dict[int, Path]:
    """The collector trace of every rank that has one (its current attempt), keyed by rank."""
    return layout.current_traces(run_dir)
