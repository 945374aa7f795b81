"""The four packages as one: `clusterx submit --procs-per-node 2 -- xtrain train CONFIG` on the local backend
trains into the job's run directory (CLUSTERX_RUN_DIR, no --run-dir given), xtop in a real terminal (tmux)
watches it against that database (the job's state, its step and loss advancing), and after the run `a` has
deeptrace analyse it in the background and the findings show."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.xdist_group("clusterx-daemon")]

BIN = Path(sys.executable).parent
STEPS = 10
STEP = re.compile(rf"step (\d+)/{STEPS}")
LOSS = re.compile(r"loss ([0-9.]+)")


class Terminal:
    """xtop in a detached tmux session of a fixed size; `screen()` is what a person would see."""

    def __init__(self, tmux: str, name: str, command: str, env: dict[str, str]) -> None:
        self.tmux, self.name = tmux, name
        exports = " ".join(f"{key}={value}" for key, value in env.items())
        subprocess.run([tmux, "new-session", "-d", "-s", name, "-x", "100", "-y", "30", f"env {exports} {command}"],
                       check=True)  # fmt: skip
        subprocess.run([tmux, "resize-window", "-t", name, "-x", "100", "-y", "30"], check=False)

    def screen(self) -> str:
        return subprocess.run([self.tmux, "capture-pane", "-p", "-t", self.name], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip

    def press(self, *keys: str) -> None:
        subprocess.run([self.tmux, "send-keys", "-t", self.name, *keys], check=True)

    def wait_for(self, predicate: Callable[[str], bool], what: str, timeout_s: float = 120.0) -> str:
        deadline = time.monotonic() + timeout_s
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if predicate(screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"xtop never showed {what}; the screen was:\n{screen}")

    def close(self) -> None:
        subprocess.run([self.tmux, "kill-session", "-t", self.name], capture_output=True, check=False)


def test_a_clusterx_job_trains_with_xtrain_and_is_watched_and_analysed_in_xtop(tmp_path: Path, tmux: str) -> None:
    env = {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "OMP_NUM_THREADS": "1",
        "CLUSTERX_DB": str(tmp_path / "clusterx.db"),
        "CLUSTERX_RUNS_DIR": str(tmp_path / "runs"),
        "CLUSTERX_DAEMON_IDLE_EXIT": "120",  # a daemon left behind by a crashed test goes away by itself
    }

    def clusterx(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "clusterx"), *args], env=env, capture_output=True, text=True, timeout=120,
                              check=False)  # fmt: skip

    settings = [f"train.max_steps={STEPS}", "data.pack_tokens=256", f"data.cache_dir={tmp_path / 'cache'}",
                "trace.profile_steps=[]"]  # fmt: skip
    # No --nproc and no --run-dir: the job's --procs-per-node and CLUSTERX_RUN_DIR are all xtrain needs.
    train = ["xtrain", "train", str(REPO_ROOT / "examples" / "debug_moe.toml")]
    train += [arg for setting in settings for arg in ("--set", setting)]
    submitted = clusterx("submit", "--json", "--name", "e2e-moe", "--procs-per-node", "2", "--workdir",
                         str(tmp_path), "--", *train)  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = str(json.loads(submitted.stdout)["id"])
    terminal = Terminal(tmux, f"xtop-e2e-{os.getpid()}", f"{BIN / 'xtop'} --refresh 0.5", env)
    try:
        terminal.wait_for(lambda s: "e2e-moe" in s and "RUNNING" in s, "the job RUNNING in the jobs table")
        terminal.press("Enter")  # open the selected (only) job's run
        first = terminal.wait_for(lambda s: STEP.search(s) is not None and LOSS.search(s) is not None, "a step")
        first_step = int(STEP.search(first).group(1))  # type: ignore[union-attr]
        first_loss = LOSS.search(first).group(1)  # type: ignore[union-attr]
        later = terminal.wait_for(
            lambda s: (m := STEP.search(s)) is not None and int(m.group(1)) > first_step, "the step advancing"
        )
        assert LOSS.search(later).group(1) != first_loss, later  # type: ignore[union-attr]
        terminal.wait_for(lambda s: f"job {job_id} SUCCEEDED" in s, "the job SUCCEEDED")
        assert f"step {STEPS}/{STEPS}" in terminal.screen()
        terminal.press("a")  # deeptrace analyze in the background; the trace screen shows its findings
        report = terminal.wait_for(lambda s: "stragglers:" in s and "hang:" in s, "the trace findings")
        assert "per rank" in report and "hang: none" in report, report
        assert re.search(r"^\s*0\s+\S+%", report, re.MULTILINE) and re.search(r"^\s*1\s+\S+%", report, re.MULTILINE)
    finally:
        terminal.close()
        clusterx("cancel", job_id, "--yes")
        clusterx("daemon", "stop")

    described = json.loads(clusterx("describe", job_id, "--json").stdout)
    run_dir = Path(described["run_dir"])
    assert run_dir.parent == tmp_path / "runs"  # chosen by clusterx, handed to xtrain as CLUSTERX_RUN_DIR
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))
    assert json.loads((run_dir / "meta.json").read_text())["world_size"] == 2
    assert (run_dir / "deeptrace" / "report.json").is_file()
