"""The Kineto profiler's `USDT: ... profiler_start` notices go to the rank's log, not to the terminal, while
anything else written to stderr meanwhile (a warning, an error) still reaches it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

_PROFILE = """
import os, sys, torch
from pathlib import Path
from xtrain.train.profiler import _QuietProfile
log = Path(sys.argv[1])
def noisy():
    os.write(2, b"WARNING: a real problem\\n")
with_quiet = sys.argv[2] == "quiet"
activities = [torch.profiler.ProfilerActivity.CPU]
profile = _QuietProfile(log, activities=activities) if with_quiet else torch.profiler.profile(activities=activities)
with profile:
    torch.ones(4).sum()
    noisy()
"""


def _run(tmp_path: Path, mode: str) -> tuple[str, str]:
    log = tmp_path / f"rank-0-{mode}.log"
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_PROFILE), str(log), mode], capture_output=True, text=True, check=True
    )
    return result.stderr, log.read_text() if log.exists() else ""


def test_kineto_notices_go_to_the_log_and_other_stderr_stays(tmp_path: Path) -> None:
    loud_stderr, _ = _run(tmp_path, "plain")
    assert "profiler_start" in loud_stderr  # what the user saw before: Kineto writes it to descriptor 2

    stderr, log = _run(tmp_path, "quiet")
    assert "USDT" not in stderr and "profiler_st" not in stderr
    assert "profiler_start" in log and "profiler_stop" in log
    assert "WARNING: a real problem" in stderr  # not a notice: it still reaches the terminal
    assert "a real problem" not in log
