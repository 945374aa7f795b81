"""Follows the growing trace files of a live run: each poll reads only the bytes appended since the last one.

The Collector appends records at each step end, so the watcher sees every step window and every collective
(group, sequence number, start) a moment after the step ends, without reading the file again from the start.
Only the recent steps and collectives are kept (`keep`): a watch over a week-long run stays small.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from deeptrace.collect import trace_format as fmt
from deeptrace.errors import TraceInputError
from deeptrace.rundir import layout, read_rank_clock
from deeptrace.rundir.jsonl import CUT_AFTER_S
from deeptrace.rundir.records import ClockRef
from deeptrace.spans import Category

COMM_CODE = fmt.CATEGORY_CODES[Category.COMM]


@dataclass(frozen=True, slots=True)
class Arrival:
    group: str
    seq: int
    name: str
    start_wall_ns: int


@dataclass(frozen=True, slots=True)
class StepWindow:
    step: int
    start_wall_ns: int
    end_wall_ns: int


@dataclass
class RankTrace:
    """What one rank's trace said lately."""

    path: Path
    clock: ClockRef | None = None
    offset: int = 0
    inode: int | None = None
    strings: dict[int, str] = field(default_factory=dict)
    arrivals: deque[Arrival] = field(default_factory=deque)
    steps: deque[StepWindow] = field(default_factory=deque)
    problem: str | None = None
    cut_at: int | None = None  # the offset at which the file was found cut off (named once)

    def poll(self, keep: int) -> None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return
        size = stat.st_size
        if stat.st_ino != self.inode or size < self.offset:  # a restarted rank set the old file aside: a new one
            self.inode = stat.st_ino
            self.offset, self.strings, self.clock = 0, {}, None
            self.arrivals.clear()
            self.steps.clear()
        if size == self.offset:
            return
        if self.clock is None:  # once per poll, not per span: it may be missing (a trace copied without it)
            rank = layout.rank_of_file(self.path)
            with contextlib.suppress(TraceInputError):
                self.clock = read_rank_clock(self.path.parent.parent, rank if rank is not None else -1).start
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read(size - self.offset)
        start = 0
        if self.offset == 0:
            if len(data) < fmt.HEADER.size:
                return
            start = fmt.HEADER.unpack_from(data, 0)[2]  # header size
        self.offset += self._parse(data, start, keep)
        if size > self.offset and self.cut_at != self.offset and time.time() - stat.st_mtime >= CUT_AFTER_S:
            # Bytes after the last whole record that no writer has added to for a while: the rank's writer died
            # inside a record (a node that went down). Named once; the spans before it are what the rank did.
            self.cut_at = self.offset
            self.problem = self.problem or (
                f"{self.path}: cut off inside its last record ({size - self.offset} bytes of a record its writer"
                " never finished: it died mid-record); followed up to the last whole record"
            )

    def _parse(self, data: bytes, pos: int, keep: int) -> int:
        """Records from data[pos:]; returns how many bytes were complete records (a torn tail waits)."""
        span_size, string_head = fmt.SPAN.size, fmt.STRING_HEAD.size
        while pos < len(data):
            tag = data[pos]
            if tag == fmt.TAG_STRING:
                if pos + string_head > len(data):
                    break
                _, string_id, length = fmt.STRING_HEAD.unpack_from(data, pos)
                if pos + string_head + length > len(data):
                    break
                self.strings[string_id] = data[pos + string_head : pos + string_head + length].decode(errors="replace")
                pos += string_head + length
            elif tag == fmt.TAG_SPAN:
                if pos + span_size > len(data):
                    break
                self._span(fmt.SPAN.unpack_from(data, pos), keep)
                pos += span_size
            else:
                self.problem = f"{self.path}: unknown record tag {tag}; stopped following it"
                return len(data)  # never read this damage again
        return pos

    def _span(self, record: tuple[int, ...], keep: int) -> None:
        _, category, name_id, track_id, group_id, start, end, step, _layer, seq, _nbytes = record
        to_wall = self.clock.to_wall_ns if self.clock is not None else (lambda t: t)
        if self.strings.get(track_id) == fmt.STEP_TRACK and step != fmt.NONE_I64:
            self.steps.append(StepWindow(step, to_wall(start), to_wall(end)))
            while len(self.steps) > keep:
                self.steps.popleft()
        elif category == COMM_CODE and group_id != fmt.NO_STRING and seq != fmt.NONE_I64:
            name = self.strings.get(name_id, "?")
            self.arrivals.append(Arrival(self.strings.get(group_id, "?"), seq, name, to_wall(start)))
            while len(self.arrivals) > keep:
                self.arrivals.popleft()


class TraceFollower:
    """Every current rank trace of a run directory (new ranks are picked up as their files appear)."""

    def __init__(self, run_dir: Path, keep: int = 256) -> None:
        self.run_dir = run_dir
        self.keep = keep
        self.ranks: dict[int, RankTrace] = {}

    def poll(self) -> dict[int, RankTrace]:
        for rank, path in layout.current_traces(self.run_dir).items():
            self.ranks.setdefault(rank, RankTrace(path)).poll(self.keep)
        return self.ranks
