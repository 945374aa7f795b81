"""``xtrain train --nproc 2`` dies with its launcher: SIGKILL of the launcher's process group, SIGKILL of torchrun's
agent alone, and SIGTERM of the launcher (landing in the middle of a checkpoint save) each leave no process of the
run behind within seconds, and the run directory then resumes with ``--resume auto``.

Without the parent-death signal the ranks (torchrun starts them in sessions of their own) are re-parented to
init and keep training; without the launcher passing SIGTERM on, the launcher dies alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.engine.checkpoint.cli_runs import (
    DEBUG_CONFIG,
    XTRAIN,
    complete,
    environment,
    metrics,
    short_run,
    steps_logged,
    wait_until,
    xtrain,
)

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

GONE_WITHIN_S = 10.0
QUICK = ("eval.sources=[]", "eval.sample_prompts=[]", "trace.enabled=false")


def settings(root: Path, *overrides: str) -> list[str]:
    return short_run(root / "cache", *QUICK, *overrides)


def start_job(root: Path, run_dir: Path, *overrides: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A long 2-process run, its launcher leading a process group of its own (as a shell's job would)."""
    args = [XTRAIN, "train", str(DEBUG_CONFIG), "--nproc", "2", "--run-dir", str(run_dir)]
    args += settings(root, "train.max_steps=10000", *overrides)
    with (root / "job.log").open("ab") as log:
        return subprocess.Popen(
            args, cwd=root, stdout=log, stderr=subprocess.STDOUT, env=env or environment(), start_new_session=True
        )


def job_processes(launcher: subprocess.Popen[bytes]) -> tuple[psutil.Process, list[psutil.Process]]:
    """torchrun's agent and the two ranks, once all are up."""
    found: list[psutil.Process] = []

    def ranks_up() -> bool:
        agents = [p for p in psutil.Process(launcher.pid).children() if "xtrain.train.torchrun" in p.cmdline()]
        found[:] = agents + (agents[0].children() if agents else [])
        return len(found) == 3

    wait_until(ranks_up, "torchrun's agent and the two ranks", timeout_s=120)
    agent, ranks = found[0], found[1:]
    assert all("xtrain.train.lifeline" in rank.cmdline() for rank in ranks)
    assert all(rank.ppid() == agent.pid for rank in ranks)
    assert all(os.getsid(rank.pid) != os.getsid(launcher.pid) for rank in ranks)  # out of the launcher's session
    return agent, ranks


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_all_gone(processes: list[psutil.Process]) -> None:
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline and any(alive(p) for p in processes):
        time.sleep(0.1)
    left = [(p.pid, p.cmdline()) for p in processes if alive(p)]
    for process in processes:  # never leave a stray trainer on the machine, even when the test fails
        if alive(process):
            process.kill()
    assert not left, f"still running {GONE_WITHIN_S} s later: {left}"


def training(run_dir: Path, steps: int = 3) -> None:
    wait_until(lambda: len(steps_logged(run_dir)) >= steps and complete(run_dir, 2), f"{steps} steps", 300)


def assert_resumes(root: Path, run_dir: Path) -> None:
    """The directory is free (no stale lock) and continues from its newest complete checkpoint."""
    last = max(steps_logged(run_dir))
    args = ("train", DEBUG_CONFIG, "--nproc", "2", "--run-dir", run_dir, "--resume", "auto")
    done = xtrain(*args, *settings(root, f"train.max_steps={last + 2}"), cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    resumed = [record for record in metrics(run_dir) if "resumed_from_step" in record]
    assert resumed and resumed[-1]["resumed_from_step"] >= 2, resumed
    assert max(steps_logged(run_dir)) == last + 2


def test_sigkill_of_the_launchers_process_group_takes_the_ranks_down(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    launcher = start_job(tmp_path, run_dir)
    try:
        agent, ranks = job_processes(launcher)
        training(run_dir)
        os.killpg(launcher.pid, signal.SIGKILL)  # what a supervisor or `kill -9 -PGID` does: launcher and agent
        launcher.wait(timeout=30)
        assert_all_gone([agent, *ranks])
    finally:
        launcher.kill()
    assert_resumes(tmp_path, run_dir)


def test_sigkill_of_the_agent_alone_takes_the_ranks_and_the_launcher_down(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    launcher = start_job(tmp_path, run_dir)
    try:
        agent, ranks = job_processes(launcher)
        training(run_dir)
        agent.send_signal(signal.SIGKILL)
        assert launcher.wait(timeout=30) != 0
        assert_all_gone(ranks)
    finally:
        launcher.kill()
    assert "killed by SIGKILL" in (tmp_path / "job.log").read_text()
    assert_resumes(tmp_path, run_dir)


def test_sigterm_of_the_launcher_in_the_middle_of_a_save_stops_the_ranks_and_abandons_the_save(
    tmp_path: Path,
) -> None:
    """The save of step 4 stops for a minute after each rank's data file is written: SIGTERM lands in it. The job
    ends with 143, the half-written save gets no marker, step 2 stays the newest checkpoint and resumes."""
    run_dir = tmp_path / "run"
    step_4 = run_dir / "checkpoints" / "step-4"
    launcher = start_job(tmp_path, run_dir, env=environment(XTRAIN_TEST_PAUSE_IN_SAVE="4:60"))
    try:
        agent, ranks = job_processes(launcher)
        wait_until(lambda: len(list(step_4.glob("*.distcp"))) == 2, "both ranks' files of the save of step 4")
        started = time.monotonic()
        launcher.send_signal(signal.SIGTERM)  # what `timeout` or a service manager sends: the launcher alone
        assert launcher.wait(timeout=60) == 128 + signal.SIGTERM
        assert time.monotonic() - started < 30  # the ranks stopped out of the paused save, torchrun did not wait
        assert_all_gone([agent, *ranks])
    finally:
        launcher.kill()
    said = (tmp_path / "job.log").read_text()
    assert "xtrain: stopped by SIGTERM" in said, said
    assert "Traceback" not in said, said
    assert complete(run_dir, 2) and not complete(run_dir, 4)
    assert_resumes(tmp_path, run_dir)
