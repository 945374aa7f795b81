"""`deeptrace diff` through its command line: bad input (one message, exit 2, no traceback), the terminal tables,
--output DIR (diff.json, diff.md and the bar chart), and run directories of collector traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest
from click.testing import CliRunner, Result
from deeptrace.cli import main

from tests.deeptrace.kineto_builders import NCCL_ALLREDUCE, allreduce_ranks, collector_run, write_ranks


def diff(*args: str | Path) -> Result:
    return CliRunner().invoke(main, ["diff", *map(str, args), "-j", "1"], env={"COLUMNS": "200"},
                              catch_exceptions=False)  # fmt: skip


@pytest.fixture(scope="module")
def kineto_sides(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A: every all-reduce 7 ms; B: 10 ms (the others wait 3 ms longer); 2 all-reduces in each step's window."""
    root = tmp_path_factory.mktemp("sides")
    write_ranks(allreduce_ranks(2, steps=2, per_step=2), root / "a")
    write_ranks(allreduce_ranks(2, steps=2, per_step=2, late_us=8000), root / "b")
    return root / "a", root / "b"


def _one_error(result: Result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("deeptrace: error:")]
    assert len(errors) == 1, result.stderr
    assert all(f in errors[0] for f in fragments), errors[0]
    assert result.stdout == ""


def test_missing_directory(tmp_path: Path, kineto_sides: tuple[Path, Path]) -> None:
    _one_error(diff(tmp_path / "nowhere", kineto_sides[1]), "nowhere", "no such directory")
    _one_error(diff(kineto_sides[0], tmp_path / "gone"), "gone", "no such directory")


def test_folder_without_traces(tmp_path: Path, kineto_sides: tuple[Path, Path]) -> None:
    (tmp_path / "empty").mkdir()
    _one_error(diff(tmp_path / "empty", kineto_sides[1]), "empty", "nothing to analyse")


def test_folder_whose_only_trace_is_unreadable(tmp_path: Path, kineto_sides: tuple[Path, Path]) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "rank-0.json").write_text('{"traceEvents": [')
    result = diff(kineto_sides[0], tmp_path / "bad")
    _one_error(result, "bad", "no trace could be read")
    assert "rank-0.json" in result.stderr  # the warning names the file


def test_step_beyond_the_range(kineto_sides: tuple[Path, Path]) -> None:
    _one_error(diff(*kineto_sides, "--step", "99"), "no step 99", "steps: 0, 1, 2")


def test_step_that_is_no_number(kineto_sides: tuple[Path, Path]) -> None:
    _one_error(diff(*kineto_sides, "--step", "last"), "--step last", "'first' or 'all'")


def test_rank_not_in_the_run(kineto_sides: tuple[Path, Path]) -> None:
    _one_error(diff(*kineto_sides, "--rank", "5"), "no rank 5", "ranks: 0, 1")


def test_step_beyond_the_range_of_collector_traces(tmp_path: Path) -> None:
    a, b = collector_run(tmp_path / "a", 2, steps=2), collector_run(tmp_path / "b", 2, steps=2)
    _one_error(diff(a, b, "--step", "7"), "no step 7", "steps: 0, 1")


def test_terminal_tables_largest_change_first(kineto_sides: tuple[Path, Path]) -> None:
    result = diff(*kineto_sides)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "step: first; delta = B − A; times in µs" in out
    rows = [[cell.strip() for cell in line.strip("│").split("│")] for line in out.splitlines() if line.startswith("│")]
    ops = [r for r in rows if len(r) == 6]
    assert ops[0][0].startswith("ncclDevKernel_AllReduce") and ops[0][1:] == ["2", "2", "14,000", "20,000", "+6,000"]
    assert all(r[5] == "+0" for r in ops[1:])  # nothing else changed
    kinds = [r for r in rows if len(r) == 10]
    assert kinds == [["all_reduce", "2", "2", "—", "—", "14,000", "20,000", "14,000", "20,000", "+6,000"]]
    ranks = [r for r in rows if len(r) == 7]
    assert ranks == [["0", "28,000", "31,000", "+3,000", "14,000", "20,000", "+6,000"],
                     ["1", "28,000", "31,000", "+3,000", "14,000", "20,000", "+6,000"]]  # fmt: skip


def test_output_folder_has_json_markdown_and_chart(tmp_path: Path, kineto_sides: tuple[Path, Path]) -> None:
    result = diff(*kineto_sides, "--output", tmp_path / "out")
    assert result.exit_code == 0, result.output
    written = tmp_path / "out"
    assert "Written:" in result.stdout and str(written / "diff.png") in result.stdout.replace("\n", "")
    data = orjson.loads((written / "diff.json").read_bytes())
    assert data["ops"][0]["name"] == NCCL_ALLREDUCE and data["ops"][0]["delta_us"] == 6000
    assert data["collectives"]["all_reduce"]["b_exposed_us"] == 20000
    markdown = (written / "diff.md").read_text()
    assert "![largest changes](diff.png)" in markdown
    assert "## Ops (CPU operators, annotations, GPU kernels)" in markdown
    op_rows = [line for line in markdown.splitlines() if line.startswith("| ncclDevKernel_AllReduce")]
    assert len(op_rows) == 1 and op_rows[0].endswith("| 2 | 2 | 14,000 | 20,000 | +6,000 |")
    assert "| all_reduce | 2 | 2 | — | — | 14,000 | 20,000 | 14,000 | 20,000 | +6,000 |" in markdown
    import matplotlib.image  # only this test reads the picture

    pixels = matplotlib.image.imread(written / "diff.png")[..., :3]
    assert pixels.shape[1] == 1100 and pixels.shape[0] >= 300  # 11 in × 100 dpi: room for the op names
    red = np.all(np.abs(pixels - np.array([0xDD, 0x55, 0x55]) / 255) < 0.02, axis=-1)
    assert red.sum() > 10_000  # the two bars that grew (the all-reduce, its exposed time); unchanged ops drawn none
    blue = np.all(np.abs(pixels - np.array([0x4C, 0x72, 0xB0]) / 255) < 0.02, axis=-1)
    assert blue.sum() == 0


def test_no_png(tmp_path: Path, kineto_sides: tuple[Path, Path]) -> None:
    result = diff(*kineto_sides, "--output", tmp_path / "out", "--no-png")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["diff.json", "diff.md"]
    assert "diff.png" not in (tmp_path / "out" / "diff.md").read_text()


def test_run_directories_of_collector_traces(tmp_path: Path) -> None:
    """B's rank 1 computes 5 ms longer per step: rank 0 waits 5 ms longer in its all-reduce."""
    a = collector_run(tmp_path / "a", 2, steps=3, late_ms=0.0)
    b = collector_run(tmp_path / "b", 2, steps=3, slow_rank=1, late_ms=5.0)
    result = diff(a, b, "--json", "--step", "all")
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.stdout)
    assert data["a"]["steps"] == [0, 1, 2] and data["a"]["collector"].endswith("rank-0.dtr")
    spans = {row["name"]: row for row in data["spans"]}
    assert spans["all_reduce"]["a_total_us"] == pytest.approx(3 * 2000)
    assert spans["all_reduce"]["b_total_us"] == pytest.approx(3 * 7000)
    assert spans["forward"]["delta_us"] == 0
    assert data["spans"][0]["name"] == "all_reduce"  # the largest change first
    kinds = data["collectives"]["all_reduce"]
    assert (kinds["a_exposed_us"], kinds["b_exposed_us"]) == (pytest.approx(6000), pytest.approx(21000))
    ranks = {row["rank"]: row for row in data["ranks"]}
    assert ranks[0]["delta_exposed_us"] == pytest.approx(5000) and ranks[1]["delta_exposed_us"] == pytest.approx(0)
    assert data["ops"] == []  # no Kineto trace on either side
