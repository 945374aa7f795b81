"""The streaming JSON reader: same events and metadata as json.load, at any chunk size; one clear error per problem."""

import gzip
import json
from pathlib import Path

import pytest
from deeptrace.errors import TraceInputError
from deeptrace.kineto.stream import TraceEventStream

from tests.deeptrace.kineto_builders import known_overlap_trace


def _read(path: Path, chunk: int = 1 << 20) -> tuple[list[object], dict[str, object]]:
    stream = TraceEventStream(path, chunk_chars=chunk)
    events = list(stream.events())
    return events, stream.metadata


@pytest.mark.parametrize("name", ["kineto/rank-0.json.gz", "kineto-single/rank-0.json.gz"])
def test_real_traces_read_like_json_load(shared_data: Path, name: str) -> None:
    path = shared_data / name
    with gzip.open(path) as fh:
        expected = json.load(fh)
    events, metadata = _read(path, chunk=64 << 10)
    assert events == expected.pop("traceEvents")
    assert metadata == expected  # keys before and after traceEvents (baseTimeNanoseconds comes last)


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_any_chunk_boundary(tmp_path: Path, chunk: int) -> None:
    doc = {"schemaVersion": 1, "traceEvents": [{"ts": 123456789, "name": "a\\\"b\u00e9", "args": {"x": [1, 2.5]}},
           {"ts": 98765432101234}, []], "baseTimeNanoseconds": 1711964646000000000}  # fmt: skip
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc, indent=2))
    events, metadata = _read(path, chunk)
    assert events == doc["traceEvents"]
    assert metadata == {"schemaVersion": 1, "baseTimeNanoseconds": 1711964646000000000}


def test_truncated_gzip_names_file(tmp_path: Path) -> None:
    data = gzip.compress(json.dumps(known_overlap_trace().document()).encode())
    path = tmp_path / "rank-0.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceInputError, match=r"rank-0\.json\.gz") as info:
        _read(path)
    assert "truncated" in str(info.value)


def test_truncated_plain_json(tmp_path: Path) -> None:
    text = json.dumps(known_overlap_trace().document(), indent=1)
    path = tmp_path / "rank-0.json"
    path.write_text(text[: len(text) * 2 // 3])
    with pytest.raises(TraceInputError, match="truncated"):
        _read(path, chunk=256)


def test_invalid_json_gives_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"schemaVersion": 1,\n "traceEvents": [\n  {"ts": 1},\n  {"ts": 2,,}\n ]}\n')
    with pytest.raises(TraceInputError) as info:
        _read(path)
    assert info.value.line == 4
    assert "bad.json:4" in str(info.value)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [("", "empty file"), ("[1, 2]", "not a JSON object"), ('{"a": 1} x', "extra data"), ("\xff\xfe", "UTF-8")],
)
def test_not_a_document(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(TraceInputError, match=fragment):
        _read(path)
