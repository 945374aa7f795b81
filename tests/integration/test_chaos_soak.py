"""The chaos soak's short version (tools/chaos/soak.py --ci): a clusterx job of examples/debug_moe.toml killed 4
times (a rank during an asynchronous save, a rank during a background Hugging Face export, the clusterx daemon,
a rank at a random moment) ends SUCCEEDED with every step's figures and the final weights of an undisturbed run,
bit for bit, each step logged once as the typed reader takes it, and a run directory deeptrace analyses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.timeout(1500)]


def test_the_short_soak_loses_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "chaos" / "soak.py"), "--ci", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=1400, check=False,
    )  # fmt: skip
    assert done.stdout.strip(), done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["kills"] == 4, (result["kill_kinds"], result)
    assert {"save", "export", "daemon"} <= {kind.removesuffix("-late") for kind in result["kill_kinds"]}, result
    assert result["job_state"] == "SUCCEEDED" and result["attempts"] >= 4, result
    assert result["steps_identical"] and result["weights_identical"] and result["identical"], result
    assert result["lost_steps"] == 0 and result["duplicate_steps"] == 0, result
    assert result["hf_exports_whole"] and result["analyze_ok"], result
    assert done.returncode == 0, done.stderr[-3000:]
