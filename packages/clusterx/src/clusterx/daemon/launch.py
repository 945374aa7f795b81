"""Starting one attempt of a local job: its environment, log files, and the wrapper process leading a new
process group."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from clusterx.daemon import wrapper
from clusterx.jobenv import job_environment
from clusterx.paths import attempt_dir
from clusterx.spec import JobSpec

WRAPPER = Path(wrapper.__file__)
LOCAL_BACKEND = "local"  # this daemon is the local backend's (clusterx.backends.local)


@dataclass
class Launched:
    pid: int
    pgid: int
    proc_start_time: float  # psutil's create_time: with the pid, it names this very process
    process: subprocess.Popen[bytes]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def local_environment(
    spec: JobSpec, *, job_id: int, attempt: int, run_dir: str, gpu_ids: list[int], master_port: int
) -> dict[str, str]:
    """The job's environment (clusterx.jobenv) plus what the local launcher tells it (torchrun's variables)."""
    launcher = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(spec.world_size),
        "NODE_RANK": "0",
        "LOCAL_WORLD_SIZE": str(spec.procs_per_node),
        # A job that asked for no GPU sees none: it cannot take another job's GPU by accident.
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpu_ids),
    }
    env = job_environment(
        spec, backend=LOCAL_BACKEND, job_id=job_id, attempt=attempt, run_dir=run_dir, launcher=launcher
    )
    env.setdefault("PATH", os.defpath)
    return env


def launch(spec: JobSpec, job_id: int, attempt: int, run_dir: str, gpu_ids: list[int]) -> Launched:
    directory = attempt_dir(run_dir, attempt)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in (wrapper.EXIT_FILE, wrapper.PID_FILE):
        (directory / stale).unlink(missing_ok=True)
    env = local_environment(
        spec, job_id=job_id, attempt=attempt, run_dir=run_dir, gpu_ids=gpu_ids, master_port=free_port()
    )
    workdir = spec.workdir or run_dir
    with (directory / "stdout.log").open("ab") as stdout, (directory / "stderr.log").open("ab") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-I", str(WRAPPER), str(directory), "--", *spec.command],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,  # the wrapper leads a new process group: the job is killed as a whole
            close_fds=True,
        )
    try:
        start_time = psutil.Process(process.pid).create_time()
    except psutil.NoSuchProcess:
        start_time = 0.0  # already gone; its exit status is read from the file or from waitpid
    return Launched(pid=process.pid, pgid=process.pid, proc_start_time=start_time, process=process)


def same_process_alive(pid: int, proc_start_time: float) -> bool:
    """True when `pid` still names the process started at `proc_start_time` (not a reused pid, not a zombie)."""
    try:
        process = psutil.Process(pid)
        if abs(process.create_time() - proc_start_time) > 0.05:
            return False
        return bool(process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False
