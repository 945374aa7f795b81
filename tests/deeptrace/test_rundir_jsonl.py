"""JSON Lines reading of growing files: half-written last lines, corrupt middle lines, incremental following."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from deeptrace.errors import TraceInputError
from deeptrace.rundir import JsonlFollower, read_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st


def _line(obj: dict[str, object]) -> bytes:
    return orjson.dumps(obj) + b"\n"


def test_half_written_last_line_is_skipped_not_raised(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(_line({"step": 0}) + b'{"step": 1, "lo')
    assert read_jsonl(path) == [{"step": 0}]


def test_complete_last_line_without_newline_is_a_record(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(_line({"step": 0}) + b'{"step": 1}')
    assert read_jsonl(path) == [{"step": 0}, {"step": 1}]


def test_corrupt_middle_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(_line({"step": 0}) + b"\n" + b"{not json}\n" + _line({"step": 2}))
    with pytest.raises(TraceInputError) as caught:
        read_jsonl(path)
    assert caught.value.line == 3 and caught.value.path == path
    assert f"{path}:3" in str(caught.value)


def test_non_object_line_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b"[1, 2]\n")
    with pytest.raises(TraceInputError, match="expected a JSON object"):
        read_jsonl(path)


def test_follower_returns_only_new_records_and_waits_for_the_newline(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    follower = JsonlFollower(path)
    assert follower.poll() == []  # no file yet
    with path.open("ab") as out:
        out.write(_line({"step": 0}) + b'{"step": 1, "loss":')
        out.flush()
        assert follower.poll() == [{"step": 0}]
        assert follower.poll() == []
        out.write(b" 2.5}")
        out.flush()
        assert follower.poll() == []  # parses, but its writer has not finished the line
        out.write(b"\n" + _line({"step": 2}))
        out.flush()
    assert follower.poll() == [{"step": 1, "loss": 2.5}, {"step": 2}]
    assert follower.poll() == []
    assert follower.lines_read == 3


def test_follower_delivers_records_before_a_bad_line_then_raises_once_then_continues(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(_line({"a": 1}) + b"garbage\n" + _line({"a": 3}))
    follower = JsonlFollower(path)
    assert follower.poll() == [{"a": 1}]
    with pytest.raises(TraceInputError) as caught:
        follower.poll()
    assert caught.value.line == 2
    assert follower.poll() == [{"a": 3}]


def test_follower_restarts_when_the_file_is_replaced_by_a_shorter_one(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(_line({"a": 1}) + _line({"a": 2}))
    follower = JsonlFollower(path)
    assert len(follower.poll()) == 2
    path.write_bytes(_line({"b": 1}))
    assert follower.poll() == [{"b": 1}]


@settings(max_examples=60, deadline=None)
@given(
    records=st.lists(
        st.dictionaries(
            st.text(max_size=5),
            st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=8), st.floats(allow_nan=False)),
        ),
        max_size=8,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6),
)
def test_follower_sees_each_record_once_however_the_writes_are_split(
    tmp_path_factory: pytest.TempPathFactory, records: list[dict[str, object]], cuts: list[int]
) -> None:
    path = tmp_path_factory.mktemp("follow") / "m.jsonl"
    data = b"".join(_line(r) for r in records)
    follower = JsonlFollower(path)
    seen: list[dict[str, object]] = []
    position = 0
    with path.open("ab") as out:
        for cut in [*sorted(c for c in cuts if c < len(data)), len(data)]:
            out.write(data[position:cut])
            out.flush()
            position = max(position, cut)
            seen += follower.poll()
    assert seen == [orjson.loads(_line(r)) for r in records]
