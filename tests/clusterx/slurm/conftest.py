"""A REAL one-node Slurm cluster for the tests: installed if missing, started once per session, stopped after.

slurmctld and slurmd from Debian's slurm-wlm run in the foreground as children of this process (so they are
stopped by their PIDs), with every file in a temporary folder and free ports, so that several test sessions on
one machine never meet. Authentication is auth/none + cred/none when this Slurm has those plugins (22.05 does),
else munge, started here too. No slurmdbd: finished jobs are read from the job-completion log (jobcomp/filetxt),
which is the clusters-without-accounting path the backend must handle.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from clusterx.backends.base import BackendStatus
from clusterx.backends.slurm import SlurmBackend

from tests.debian_packages import apt_install

SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
PLUGIN_DIRS = [Path("/usr/lib/x86_64-linux-gnu/slurm-wlm"), Path("/usr/lib/slurm-wlm"), Path("/usr/lib64/slurm")]
NODE_CPUS = 4  # more than the machine's 2 cores (config_overrides): the tests' jobs mostly sleep
NODE_MEMORY_MIB = 4000


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    node: str
    status_dir: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def backend(self, **options: str) -> SlurmBackend:
        return SlurmBackend({"slurm_conf": str(self.conf), "state_dir": str(self.status_dir), **options})

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60, check=False)

    def log_tail(self) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.root / "log" / name
            if path.exists():
                parts.append(f"--- {name}\n" + "\n".join(path.read_text().splitlines()[-30:]))
        return "\n".join(parts)


def wait_for_status(
    backend: SlurmBackend, job_id: str, done: Callable[[BackendStatus], bool], timeout: float = 60.0
) -> BackendStatus:
    """Poll until `done(status)`; fails with the last status seen."""
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        status = backend.poll([job_id]).get(job_id)
        if status is not None and done(status):
            return status
        time.sleep(0.5)
    pytest.fail(f"job {job_id} did not reach the expected state within {timeout:.0f} s; last seen: {status}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ensure_slurm_installed() -> None:
    if shutil.which("slurmctld", path=SBIN_PATH) and shutil.which("sbatch"):
        return
    apt_install("slurm-wlm")


def _has_plugin(name: str) -> bool:
    return any((directory / f"{name}.so").exists() for directory in PLUGIN_DIRS)


def _start_munge(root: Path) -> subprocess.Popen[bytes]:
    """munged in the foreground with its key, socket and logs in `root` (only when auth/none is missing)."""
    munged = shutil.which("munged", path=SBIN_PATH)
    if munged is None:
        pytest.skip("this Slurm has no auth/none plugin and munge is not installed")
    munge_dir = root / "munge"
    munge_dir.mkdir(mode=0o700)
    key = munge_dir / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    socket_path = munge_dir / "munge.socket"
    return subprocess.Popen(
        [
            munged,
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={socket_path}",
            f"--pid-file={munge_dir / 'munged.pid'}",
            f"--log-file={munge_dir / 'munged.log'}",
            f"--seed-file={munge_dir / 'munged.seed'}",
        ],
    )


def _write_conf(root: Path, node: str, auth_none: bool) -> Path:
    for folder in ("state", "spool", "log"):
        (root / folder).mkdir()
    auth = (
        "AuthType=auth/none\nCredType=cred/none\n"
        if auth_none
        else f"AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={root / 'munge' / 'munge.socket'}\n"
    )
    conf = root / "slurm.conf"
    conf.write_text(
        f"""# One-node test cluster written by tests/clusterx/slurm/conftest.py
ClusterName=clusterx-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
{auth}ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
DefMemPerCPU=100
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root / "log" / "jobcomp.txt"}
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool"}
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd.pid"}
SlurmctldLogFile={root / "log" / "slurmctld.log"}
SlurmdLogFile={root / "log" / "slurmd.log"}
ReturnToService=2
# Finished jobs leave squeue after 2 s, so polls soon exercise the completion-log path.
MinJobAge=2
# scancel and time limits: SIGKILL 5 s after SIGTERM (30 s by default), no grace beyond the limit.
KillWait=5
OverTimeLimit=0
InactiveLimit=0
NodeName={node} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} RealMemory={NODE_MEMORY_MIB} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
    )
    return conf


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    _ensure_slurm_installed()
    # A short path: slurmd puts unix sockets in its spool folder, and socket paths are limited to 107 bytes.
    root = tmp_path_factory.mktemp("slurm")
    node = socket.gethostname().split(".")[0]
    auth_none = _has_plugin("auth_none") and _has_plugin("cred_none")
    daemons: list[subprocess.Popen[bytes]] = []
    if not auth_none:
        daemons.append(_start_munge(root))
    conf = _write_conf(root, node, auth_none)
    cluster = SlurmCluster(root=root, conf=conf, node=node, status_dir=root / "status")
    env = cluster.env
    try:
        for daemon in ("slurmctld", "slurmd"):
            program = shutil.which(daemon, path=SBIN_PATH)
            assert program is not None
            # -D: foreground, a child of this process, stopped by its PID below.
            daemons.append(
                subprocess.Popen(
                    [program, "-D", "-f", str(conf)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            )
        deadline = time.monotonic() + 60
        while True:
            sinfo = cluster.run("sinfo", "--noheader", "--format=%T")
            if sinfo.returncode == 0 and sinfo.stdout.strip() == "idle":
                break
            if time.monotonic() > deadline or any(d.poll() is not None for d in daemons):
                pytest.fail(f"the test Slurm did not become idle: {sinfo.stdout}{sinfo.stderr}\n{cluster.log_tail()}")
            time.sleep(0.3)
        yield cluster
    finally:
        if shutil.which("scancel"):
            cluster.run("scancel", "--full", "--user", str(os.getuid()))
        for daemon_process in reversed(daemons):
            _stop(daemon_process)
