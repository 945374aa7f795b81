"""A trace file as numpy columns: the fast way for an analysis that works on arrays rather than Span objects.

Building a Span object costs more than reading its record; `read_trace_columns` reads every span record of a
file straight into one structured numpy array (runs of span records are found with a strided view of their tag
bytes and taken whole), so a large trace loads in milliseconds. Same file, same checks, same answers as
`read_trace`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from deeptrace.collect import trace_format as fmt
from deeptrace.collect.reader import read_trace
from deeptrace.errors import TraceInputError
from deeptrace.rundir.records import RankClock
from deeptrace.spans import Span

# fmt.SPAN as a numpy record (numpy packs structured fields without padding, like struct's "<").
SPAN_DTYPE = np.dtype(
    [
        ("tag", "u1"),
        ("category", "u1"),
        ("name", "<u4"),
        ("track", "<u4"),
        ("group", "<u4"),
        ("start_ns", "<i8"),
        ("end_ns", "<i8"),
        ("step", "<i8"),
        ("layer", "<i4"),
        ("seq", "<i8"),
        ("nbytes", "<i8"),
    ]
)
assert SPAN_DTYPE.itemsize == fmt.SPAN.size


@dataclass
class TraceColumns:
    """Every span of one rank's trace as columns of `records` (fields of SPAN_DTYPE).

    `category` holds trace_format.CATEGORY_CODES; `name`, `track`, `group` index `strings` (group NO_STRING: none);
    `step`, `seq`, `nbytes` hold NONE_I64 and `layer` NONE_I32 where a span has no value. Times are the rank's
    monotonic nanoseconds; `clock` maps them to wall time.
    """

    path: Path
    rank: int
    world_size: int
    clock: RankClock | None
    clock_error: TraceInputError | None
    records: npt.NDArray[np.void]
    strings: dict[int, str] = field(default_factory=dict)
    torn_bytes: int = 0

    def __len__(self) -> int:
        return len(self.records)

    def spans(self) -> Iterator[Span]:
        """The same Spans `read_trace` yields (slower: one object per span)."""
        for row in self.records.tolist():
            _, code, name, track, group, start, end, step, layer, seq, nbytes = row
            yield Span(
                name=self.strings[name],
                category=fmt.CATEGORY_OF_CODE[code],
                start_ns=start,
                end_ns=end,
                track=self.strings[track],
                step=None if step == fmt.NONE_I64 else step,
                layer=None if layer == fmt.NONE_I32 else layer,
                nbytes=None if nbytes == fmt.NONE_I64 else nbytes,
                group=None if group == fmt.NO_STRING else self.strings[group],
                seq=None if seq == fmt.NONE_I64 else seq,
            )


def read_trace_columns(path: Path | str) -> TraceColumns:
    """Read a whole collector trace into columns. Raises TraceInputError naming the file (and the byte) for a
    missing, empty, foreign or corrupt file; a torn final record is ignored, as by `read_trace`."""
    path = Path(path)
    header = read_trace(path)  # validates the header and finds the clock reference
    header.close()
    data = path.read_bytes()
    position = header.header_size
    strings: dict[int, str] = {}
    runs: list[npt.NDArray[np.void]] = []
    torn = 0
    size = fmt.SPAN.size
    while position < len(data):
        tag = data[position]
        if tag == fmt.TAG_SPAN:
            whole = (len(data) - position) // size
            if whole == 0:
                torn = len(data) - position
                break
            tags = np.frombuffer(data, np.uint8, count=whole * size, offset=position)[::size]
            others = np.flatnonzero(tags != fmt.TAG_SPAN)
            count = int(others[0]) if others.size else whole
            runs.append(np.frombuffer(data, SPAN_DTYPE, count=count, offset=position))
            position += count * size
        elif tag == fmt.TAG_STRING:
            if position + fmt.STRING_HEAD.size > len(data):
                torn = len(data) - position
                break
            _, string_id, length = fmt.STRING_HEAD.unpack_from(data, position)
            start = position + fmt.STRING_HEAD.size
            if start + length > len(data):
                torn = len(data) - position
                break
            try:
                strings[string_id] = data[start : start + length].decode()
            except UnicodeDecodeError:
                raise _corrupt(path, position, "string record is not valid UTF-8") from None
            position = start + length
        else:
            raise _corrupt(path, position, f"unknown record tag {tag}")
    records = np.concatenate(runs) if runs else np.empty(0, SPAN_DTYPE)
    _check(path, records, strings)
    return TraceColumns(
        path=path,
        rank=header.rank,
        world_size=header.world_size,
        clock=header.clock,
        clock_error=header.clock_error,
        records=records,
        strings=strings,
        torn_bytes=torn,
    )


def _check(path: Path, records: npt.NDArray[np.void], strings: dict[int, str]) -> None:
    if len(records) == 0:
        return
    bad_code = np.flatnonzero(records["category"] >= len(fmt.CATEGORY_CODES))
    if bad_code.size:
        raise TraceInputError(path, f"corrupt trace: unknown category code in span {int(bad_code[0])}")
    groups = records["group"][records["group"] != fmt.NO_STRING]
    used = np.unique(np.concatenate([records["name"], records["track"], groups]))
    undefined = [int(i) for i in used if int(i) not in strings]
    if undefined:
        raise TraceInputError(path, f"corrupt trace: spans use undefined string id {undefined[0]}")


def _corrupt(path: Path, position: int, problem: str) -> TraceInputError:
    return TraceInputError(path, f"corrupt trace at byte {position}: {problem} (spans before it are valid)")
