"""One owner per run directory: a second ``xtrain train`` on a directory that a live run holds is refused with one
message naming the directory and the holder's pid, exit code 2, and touches nothing; the lock dies with its
holder (SIGKILL included), so it is never stale."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from xtrain.train.rundir_lock import LOCK_FILE, RunDirInUseError, RunDirLock, refuse_if_in_use

from tests.engine.checkpoint.cli_runs import DEBUG_CONFIG, complete, steps_logged, wait_until, xtrain
from tests.engine.train.test_cli_errors import assert_user_error
from tests.engine.train.test_launcher_death import assert_all_gone, job_processes, settings, start_job

HOLD = "import sys, time; from pathlib import Path; from xtrain.train.rundir_lock import RunDirLock; " \
       "RunDirLock.acquire(Path(sys.argv[1])); print('held', flush=True); time.sleep(600)"  # fmt: skip


def _snapshot(folder: Path) -> dict[str, tuple[str, float]]:
    return {
        str(path.relative_to(folder)): (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime)
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def _holder(run_dir: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_the_lock_is_refused_while_held_and_free_once_its_holder_is_killed(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    refuse_if_in_use(run_dir)  # no directory, no lock file: free, and nothing created
    assert not run_dir.exists()
    holder = _holder(run_dir)
    try:
        for attempt in (lambda: refuse_if_in_use(run_dir), lambda: RunDirLock.acquire(run_dir)):
            with pytest.raises(RunDirInUseError) as refused:
                attempt()
            assert str(run_dir) in str(refused.value) and f"pid {holder.pid}" in str(refused.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    refuse_if_in_use(run_dir)  # the kernel dropped the lock with its holder: never stale
    with RunDirLock.acquire(run_dir):
        assert (run_dir / LOCK_FILE).read_text().strip() == str(os.getpid())


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_second_run_on_a_live_run_directory_is_refused_and_touches_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = start_job(tmp_path, run_dir)
    processes: list[psutil.Process] = []
    try:
        agent, ranks = job_processes(first)
        processes = [psutil.Process(first.pid), agent, *ranks]
        wait_until(lambda: len(steps_logged(run_dir)) >= 2 and complete(run_dir, 2), "the first run's steps", 300)
        for process in processes:  # frozen, so that what the second run would touch is all that could change
            process.send_signal(signal.SIGSTOP)
        time.sleep(0.5)
        before = _snapshot(run_dir)
        for resume in ("auto", "none", str(run_dir / "checkpoints" / "step-2")):
            args = ("train", DEBUG_CONFIG, "--nproc", "2", "--run-dir", run_dir, "--resume", resume)
            second = xtrain(*args, *settings(tmp_path), cwd=tmp_path)
            assert_user_error(second, f"run directory {run_dir} is in use", f"pid {first.pid}")
        assert _snapshot(run_dir) == before
    finally:
        for process in processes:
            process.send_signal(signal.SIGCONT)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    assert_all_gone(processes[1:])
