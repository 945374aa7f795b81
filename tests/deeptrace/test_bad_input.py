"""Bad input through the CLI: one clear message naming the file, the valid part analysed, never a traceback."""

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from deeptrace.cli import main

from tests.deeptrace.kineto_builders import allreduce_ranks, write_ranks


def run(folder: Path) -> Result:
    return CliRunner().invoke(main, ["analyze", str(folder), "--json", "--no-png"], catch_exceptions=False)


def _valid_ranks(folder: Path, ranks: int = 2) -> None:
    write_ranks(allreduce_ranks(ranks, steps=2, per_step=2), folder)


def _check_one_message(result: Result, bad: Path, fragment: str) -> dict[str, object]:
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    naming = [line for line in result.stderr.splitlines() if bad.name in line]
    assert len(naming) == 1, result.stderr
    assert fragment in naming[0]
    report = json.loads(result.stdout)
    assert sum(bad.name in w for w in report["warnings"]) == 1
    return report


def test_truncated_gzip(tmp_path: Path) -> None:
    _valid_ranks(tmp_path)
    data = gzip.compress(json.dumps(allreduce_ranks(3, steps=2)[2].document()).encode())
    bad = tmp_path / "rank-2.json.gz"
    bad.write_bytes(data[: len(data) // 2])
    report = _check_one_message(run(tmp_path), bad, "truncated")
    assert sorted(report["ranks"]) == ["0", "1"]  # type: ignore[call-overload]


def test_invalid_json(tmp_path: Path) -> None:
    _valid_ranks(tmp_path)
    bad = tmp_path / "rank-5.json"
    bad.write_text('{"schemaVersion": 1, "traceEvents": [\n{"ph": "X"}\n{"ph": "X"}]}')
    _check_one_message(run(tmp_path), bad, "invalid JSON")


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}], "displayTimeUnit": "ms"}, "Kineto's markers"),
        ({"model": "llama", "layers": 32}, "no traceEvents"),
        ([1, 2, 3], "not a JSON object"),
    ],
)
def test_trace_of_another_tool(tmp_path: Path, content: object, fragment: str) -> None:
    _valid_ranks(tmp_path)
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps(content))
    _check_one_message(run(tmp_path), bad, fragment)


def test_missing_rank(tmp_path: Path) -> None:
    traces = allreduce_ranks(4, steps=2, per_step=2)
    write_ranks([traces[0], traces[1], traces[3]], tmp_path)
    result = run(tmp_path)
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert sorted(report["ranks"]) == ["0", "1", "3"]
    assert [w for w in report["warnings"] if "missing ranks 2" in w]
    assert report["collectives"]["matched"] == 4  # the present ranks still match


def test_empty_folder_exits_nonzero(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["analyze", str(tmp_path)])
    assert result.exit_code == 2
    assert "nothing to analyse" in result.stderr and str(tmp_path) in result.stderr
    assert "Traceback" not in result.output


def test_missing_folder(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["analyze", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "no such directory" in result.stderr


def test_only_bad_files_exit_nonzero(tmp_path: Path) -> None:
    (tmp_path / "rank-0.json").write_text("{")
    result = CliRunner().invoke(main, ["analyze", str(tmp_path), "--no-png"])
    assert result.exit_code == 2
    assert "rank-0.json" in result.stderr and "no trace could be analysed" in result.stderr
