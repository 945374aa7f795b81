"""`deeptrace diff` agrees with HTA's `TraceDiff.compare_traces` on the shared Kineto traces (HTA runs here).

Same counts per op name, exactly; total durations within 1 %. kineto/ has integer-microsecond timestamps, so the
totals are equal. kineto-single has nanosecond-resolution (float) timestamps, which HTA rounds inward to whole
microseconds (start up, end down: `round_down_time_stamps`), shortening each event by up to 2 µs; deeptrace keeps
nanoseconds. There an op's total may differ by that rounding (≤ 2 µs per event) where that exceeds 1 %, and the
sum over all ops stays within 1 %.
"""

import logging
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from deeptrace.cli import main

from tests.conftest import SHARED_DATA

pytestmark = pytest.mark.skipif(not (SHARED_DATA / "kineto").is_dir(), reason="no ../shared/data")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in ("kineto", "kineto-single"):
        folder = tmp_path_factory.mktemp(name)  # HTA wants folders of its own; the shared data is read-only
        for path in (SHARED_DATA / name).iterdir():
            shutil.copy(path, folder / path.name)
        out[name] = folder
    return out


def _hta(a: Path, b: Path, **kwargs: Any) -> dict[str, tuple[int, int, float, float]]:
    trace_diff = pytest.importorskip("hta.trace_diff")
    logging.disable(logging.WARNING)
    try:
        frame = trace_diff.TraceDiff.compare_traces(
            trace_diff.LabeledTrace("A", trace_dir=str(a)), trace_diff.LabeledTrace("B", trace_dir=str(b)), **kwargs
        )
    finally:
        logging.disable(logging.NOTSET)
    return {
        str(name): (int(r["A_counts"]), int(r["B_counts"]), float(r["A_total_duration"]), float(r["B_total_duration"]))
        for name, r in frame.iterrows()
    }


def _deeptrace(a: Path, b: Path, *options: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["diff", str(a), str(b), "--json", "-j", "1", *options])
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = orjson.loads(result.stdout)
    return data


def _agree(ours: dict[str, Any], hta: dict[str, tuple[int, int, float, float]], exact: bool) -> None:
    rows = {r["name"]: r for r in ours["ops"]}
    assert set(rows) == set(hta)
    for name, (a_count, b_count, a_us, b_us) in hta.items():
        row = rows[name]
        assert (row["a_count"], row["b_count"]) == (a_count, b_count), name
        for side, theirs, count in (("a", a_us, a_count), ("b", b_us, b_count)):
            mine = row[f"{side}_total_us"]
            rounding = 0 if exact else 2.0 * count
            assert abs(mine - theirs) <= max(0.01 * abs(theirs), rounding) + 1e-6, (name, side, mine, theirs)
        assert row["delta_us"] == pytest.approx(row["b_total_us"] - row["a_total_us"])
    for side, index in (("a", 2), ("b", 3)):
        total = sum(v[index] for v in hta.values())
        assert sum(r[f"{side}_total_us"] for r in ours["ops"]) == pytest.approx(total, rel=0.01)
    deltas = [abs(r["delta_us"]) for r in ours["ops"]]
    assert deltas == sorted(deltas, reverse=True)  # the largest change first


def test_first_step_of_each_side_as_hta(folders: dict[str, Path]) -> None:
    a, b = folders["kineto"], folders["kineto-single"]
    ours = _deeptrace(a, b)
    assert ours["a"]["steps"] == [551] and ours["b"]["steps"] == [4]
    _agree(ours, _hta(a, b), exact=False)


def test_same_step_other_rank_exact(folders: dict[str, Path]) -> None:
    folder = folders["kineto"]
    ours = _deeptrace(folder, folder, "--rank", "1", "--step", "552")
    hta = _hta(folder, folder, control_rank=1, test_rank=1, control_iteration=552, test_iteration=552)
    _agree(ours, hta, exact=True)
    assert all(r["delta_us"] == 0 for r in ours["ops"])


def test_every_step(folders: dict[str, Path]) -> None:
    a, b = folders["kineto"], folders["kineto-single"]
    ours = _deeptrace(a, b, "--step", "all")
    assert ours["a"]["steps"] == [551, 552] and ours["b"]["steps"] == [4, 5, 6]
    _agree(ours, _hta(a, b, control_iteration=[551, 552], test_iteration=[4, 5, 6]), exact=False)
