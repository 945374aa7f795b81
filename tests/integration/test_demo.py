"""The main job end to end: xtrain writes a run directory through deeptrace, and deeptrace analyses it."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT


@pytest.mark.slow
@pytest.mark.multiprocess
def test_demo_trains_and_its_run_directory_is_analysed(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools/demo.py"), "--run-dir", str(run_dir), "--steps", "6"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "xtrain train" in result.stdout  # the demo runs the real trainer, not a stand-in

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    assert all(math.isfinite(m["loss"]) for m in metrics)
    assert metrics[0]["loss"] > metrics[-1]["loss"]  # it learns something in six steps of AdamW at lr 3e-3
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["world_size"] == 2 and meta["model_flops_per_token"] > 0

    report = json.loads((run_dir / "deeptrace" / "report.json").read_text())
    assert sorted(report["ranks"]) == ["0", "1"]
    assert report["collectives"]["matched"] > 0
    assert report["hang"] is None
    assert (run_dir / "deeptrace" / "summary.png").stat().st_size > 0
    assert sorted(path.name for path in (run_dir / "profiler").iterdir()) == ["rank-0.json", "rank-1.json"]
