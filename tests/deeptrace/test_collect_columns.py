"""The columnar trace reader gives exactly what the Span reader gives, and explains the same bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from deeptrace.collect import Collector, read_trace, read_trace_columns
from deeptrace.collect import trace_format as fmt
from deeptrace.errors import TraceInputError
from deeptrace.rundir import layout
from deeptrace.spans import Category

from tests.deeptrace.fixtures_runs import build_clean_run


def test_columns_match_the_span_reader_on_a_whole_run(tmp_path: Path) -> None:
    run = build_clean_run(tmp_path, world_size=2, steps=3)
    for rank in range(run.world_size):
        path = layout.trace_path(tmp_path, rank)
        columns = read_trace_columns(path)
        reader = read_trace(path)
        assert list(columns.spans()) == list(reader)
        assert len(columns) == run.spans_per_rank
        assert (columns.rank, columns.world_size, columns.clock) == (rank, 2, reader.clock)
        comm = columns.records["category"] == fmt.CATEGORY_CODES[Category.COMM]
        assert np.all(columns.records["end_ns"] >= columns.records["start_ns"])
        assert {columns.strings[g] for g in columns.records["group"][comm]} == {"dp", "ep"}


def test_torn_end_is_ignored_like_the_span_reader(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        for index in range(3):
            collector.record("a", Category.COMPUTE, index, index + 1)
        collector.flush()
        collector.record("a-new-name", Category.COMPUTE, 5, 6)
    path = layout.trace_path(tmp_path, 0)
    data = path.read_bytes()
    # Inside the last span; exactly that span (nothing torn); inside the string record before it.
    for cut, torn in ((3, fmt.SPAN.size - 3), (fmt.SPAN.size, 0), (fmt.SPAN.size + 4, 7 + len("a-new-name") - 4)):
        path.write_bytes(data[:-cut])
        columns = read_trace_columns(path)
        reader = read_trace(path)
        assert list(columns.spans()) == list(reader)
        assert len(columns) == 3
        assert columns.torn_bytes == reader.torn_bytes == torn


def test_corrupt_tag_names_file_and_byte(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        for index in range(4):
            collector.record("a", Category.COMPUTE, index, index + 1)
    path = layout.trace_path(tmp_path, 0)
    data = bytearray(path.read_bytes())
    offset = len(data) - fmt.SPAN.size
    data[offset] = 9
    path.write_bytes(bytes(data))
    with pytest.raises(TraceInputError, match=f"corrupt trace at byte {offset}: unknown record tag 9"):
        read_trace_columns(path)


def test_undefined_string_is_corrupt(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        collector.record("a", Category.COMPUTE, 0, 1)
    path = layout.trace_path(tmp_path, 0)
    data = path.read_bytes()
    # Drop the string records (between the header and the span): the span's ids point nowhere.
    path.write_bytes(data[: fmt.HEADER.size] + data[-fmt.SPAN.size :])
    with pytest.raises(TraceInputError, match="undefined string id"):
        read_trace_columns(path)
    with pytest.raises(TraceInputError, match="undefined string id"):
        list(read_trace(path))


def test_foreign_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.dtr"
    path.write_text('{"traceEvents": []}')
    with pytest.raises(TraceInputError, match="not a deeptrace trace"):
        read_trace_columns(path)
