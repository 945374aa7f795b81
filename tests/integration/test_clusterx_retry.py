"""A training job that comes back by itself: ``clusterx submit --max-retries 2 -- xtrain train ... --resume auto``
on the local backend, one of its two ranks SIGKILLed mid-run. clusterx retries the job, the retry resumes from
the newest complete (asynchronously saved) checkpoint, the job ends SUCCEEDED, and every step's numbers equal
those of a run that was never killed, bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.engine.checkpoint.cli_runs import (
    DEBUG_CONFIG,
    EXACT_KEYS,
    XTRAIN,
    complete,
    latest_per_step,
    metrics,
    short_run,
    steps_logged,
    wait_until,
    xtrain,
)

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.xdist_group("clusterx-daemon")]

CLUSTERX = str(Path(sys.executable).parent / "clusterx")


def _rank_of_job(job_id: str, rank: int) -> psutil.Process | None:
    for process in psutil.process_iter():
        try:
            env = process.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if env.get("CLUSTERX_JOB_ID") == job_id and env.get("RANK") == str(rank):
            return process
    return None


def test_a_killed_rank_is_retried_by_clusterx_and_the_job_finishes_exactly(tmp_path: Path) -> None:
    settings = short_run(tmp_path / "cache", "checkpoint.async=true")
    reference = tmp_path / "reference"
    result = xtrain("train", DEBUG_CONFIG, "--nproc", "2", "--run-dir", reference, *settings, cwd=tmp_path)
    assert result.returncode == 0, result.stderr

    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "OMP_NUM_THREADS": "1",
        "CLUSTERX_DB": str(tmp_path / "clusterx.db"),
        "CLUSTERX_RUNS_DIR": str(tmp_path / "runs"),
        "CLUSTERX_DAEMON_IDLE_EXIT": "120",  # a daemon left behind by a crashed test goes away by itself
    }

    def clusterx(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([CLUSTERX, *args], env=env, capture_output=True, text=True, timeout=600, check=False)

    run_dir = tmp_path / "job"
    command = [XTRAIN, "train", str(DEBUG_CONFIG), "--nproc", "2", "--resume", "auto", *settings]
    submitted = clusterx("submit", "--json", "--name", "resumable", "--procs-per-node", "2", "--max-retries", "2",
                         "--run-dir", str(run_dir), "--workdir", str(tmp_path), "--", *command)  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = str(json.loads(submitted.stdout)["id"])
    try:
        wait_until(lambda: 3 in steps_logged(run_dir) and complete(run_dir, 2), "step 3 and checkpoint 2")
        victim = _rank_of_job(job_id, 1)
        assert victim is not None
        victim.send_signal(signal.SIGKILL)
        assert max(steps_logged(run_dir)) < 6, "the first attempt finished before the kill"
        waited = clusterx("wait", job_id, "--timeout", "500")
        described = json.loads(clusterx("describe", job_id, "--json").stdout)
    finally:
        clusterx("cancel", job_id, "--yes")
        clusterx("daemon", "stop")
    assert waited.returncode == 0, described
    assert described["state"] == "SUCCEEDED" and len(described["attempts"]) == 2, described

    records = metrics(run_dir)
    resumes = [r["resumed_from_step"] for r in records if "resumed_from_step" in r]
    assert len(resumes) == 1 and resumes[0] in (2, 4), resumes
    ours, theirs = latest_per_step(records), latest_per_step(metrics(reference))
    assert sorted(ours) == sorted(theirs) == list(range(1, 7))
    for step in theirs:
        for key in EXACT_KEYS:
            assert ours[step][key] == theirs[step][key], (step, key)  # bit for bit, the last step included
