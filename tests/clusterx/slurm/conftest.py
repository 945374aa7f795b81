"""A REAL two-node Slurm cluster for the tests: installed if missing, started once per session, stopped after.

slurmctld and two slurmd from Debian's slurm-wlm run in the foreground as children of this process (so they are
stopped by their PIDs), with every file in a temporary folder and free ports, so that several test sessions on
one machine never meet. Both nodes are this machine: Debian builds Slurm with multiple-slurmd support, so each
NodeName line has its own Port=, `slurmd -N NAME` picks its node, and %n gives each its own spool, pid and log
file. The nodes are named after this machine and `localhost`, two names that resolve here (torchrun's rendezvous
connects to the first one). The default partition `debug` holds only the first node (one-node tests know where
their job runs); the partition `two` holds both. Authentication is auth/none + cred/none when this Slurm has
those plugins (22.05 does), else munge, started here too. No slurmdbd: finished jobs are read from the
job-completion log (jobcomp/filetxt), which is the clusters-without-accounting path the backend must handle.
"""

from __future__ import annotations

import contextlib
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


MULTI_NODE_PARTITION = "two"


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    node: str  # the node of the default partition
    nodes: tuple[str, ...]  # every node, in slurm.conf's order (the partition MULTI_NODE_PARTITION)
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
        for name in ("slurmctld.log", *(f"slurmd-{node}.log" for node in self.nodes)):
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


NO_ACCOUNTING = "AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/filetxt\nJobCompLoc={jobcomp}"


def _write_conf(
    root: Path, nodes: tuple[str, ...], auth_none: bool, *, name: str = "clusterx-test", accounting: str = NO_ACCOUNTING
) -> Path:
    for folder in ("state", "log"):
        (root / folder).mkdir(exist_ok=True)
    auth = (
        "AuthType=auth/none\nCredType=cred/none\n"
        if auth_none
        else f"AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={root / 'munge' / 'munge.socket'}\n"
    )
    conf = root / "slurm.conf"
    node = nodes[0]
    node_lines = "\n".join(
        f"NodeName={name} NodeAddr=127.0.0.1 Port={free_port()} CPUs={NODE_CPUS} RealMemory={NODE_MEMORY_MIB} "
        "State=UNKNOWN"
        for name in nodes
    )
    conf.write_text(
        f"""# Two-node test cluster (both nodes on this machine) written by tests/clusterx/slurm/conftest.py
ClusterName={name}
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
{accounting.format(jobcomp=root / "log" / "jobcomp.txt")}
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool-%n"}
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd-%n.pid"}
SlurmctldLogFile={root / "log" / "slurmctld.log"}
SlurmdLogFile={root / "log" / "slurmd-%n.log"}
ReturnToService=2
# Finished jobs leave squeue after 2 s, so polls soon exercise the completion-log path.
MinJobAge=2
# scancel and time limits: SIGKILL 5 s after SIGTERM (30 s by default), no grace beyond the limit.
KillWait=5
OverTimeLimit=0
InactiveLimit=0
{node_lines}
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
PartitionName={MULTI_NODE_PARTITION} Nodes={",".join(nodes)} MaxTime=INFINITE State=UP
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


@contextlib.contextmanager
def running_cluster(
    root: Path, nodes: tuple[str, ...], *, name: str = "clusterx-test", accounting: str = NO_ACCOUNTING
) -> Iterator[SlurmCluster]:
    """slurmctld and one slurmd per node, started in the foreground as children of this process, until all nodes
    are idle; on leaving, what is left is cancelled and the daemons are stopped by their PIDs."""
    auth_none = _has_plugin("auth_none") and _has_plugin("cred_none")
    daemons: list[subprocess.Popen[bytes]] = []
    if not auth_none:
        daemons.append(_start_munge(root))
    conf = _write_conf(root, nodes, auth_none, name=name, accounting=accounting)
    cluster = SlurmCluster(root=root, conf=conf, node=nodes[0], nodes=nodes, status_dir=root / "status")
    env = cluster.env
    slurmctld, slurmd = shutil.which("slurmctld", path=SBIN_PATH), shutil.which("slurmd", path=SBIN_PATH)
    assert slurmctld is not None and slurmd is not None
    # -D: foreground, a child of this process, stopped by its PID below; -N: the node this slurmd is.
    commands = [[slurmctld, "-D", "-f", str(conf)], *([slurmd, "-D", "-N", node, "-f", str(conf)] for node in nodes)]
    try:
        for argv in commands:
            daemons.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        while True:
            sinfo = cluster.run("sinfo", "--Node", "--noheader", "--format=%N %T")
            states = dict(line.split() for line in sinfo.stdout.splitlines() if line.strip())
            if sinfo.returncode == 0 and states == dict.fromkeys(nodes, "idle"):
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


def _machine_name() -> str:
    return socket.gethostname().split(".")[0]


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    _ensure_slurm_installed()
    # A short path: slurmd puts unix sockets in its spool folder, and socket paths are limited to 107 bytes.
    root = tmp_path_factory.mktemp("slurm")
    node = _machine_name()
    if node == "localhost":
        pytest.skip("this machine is called localhost: the test cluster needs two names that resolve to it")
    with running_cluster(root, (node, "localhost")) as cluster:
        yield cluster


# -- a second cluster with real accounting: slurmdbd on a MariaDB server of its own --------------------------------

ACCOUNTING_PACKAGES = ("slurmdbd", "mariadb-server-core", "mariadb-client-core")  # the server without its services


def _wait_for(what: str, ready: Callable[[], bool], processes: list[subprocess.Popen[bytes]], log: Path) -> None:
    deadline = time.monotonic() + 60
    while not ready():
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
            tail = "\n".join(log.read_text().splitlines()[-20:]) if log.exists() else "(no log)"
            pytest.fail(f"{what} did not start:\n{tail}")
        time.sleep(0.2)


def _start_mariadb(root: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A MariaDB server in `root/db` on a free port of 127.0.0.1 with a `slurm` user; (process, port)."""
    install = subprocess.run(
        ["mariadb-install-db", "--no-defaults", f"--datadir={root / 'db'}", "--user=root",
         "--auth-root-authentication-method=normal", "--skip-test-db"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if install.returncode != 0:
        pytest.fail(f"mariadb-install-db failed: {install.stdout[-2000:]}{install.stderr[-2000:]}")
    port, sock, log = free_port(), root / "mariadb.sock", root / "log" / "mariadb.err"
    server = subprocess.Popen(
        ["mariadbd", "--no-defaults", f"--datadir={root / 'db'}", "--user=root", f"--socket={sock}", f"--port={port}",
         "--bind-address=127.0.0.1", "--skip-name-resolve", "--innodb-buffer-pool-size=64M", f"--log-error={log}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = ["mariadb", "--no-defaults", f"--socket={sock}", "--user=root"]

    def answers() -> bool:
        return subprocess.run([*client, "-e", "SELECT 1"], capture_output=True, timeout=30, check=False).returncode == 0

    _wait_for("MariaDB", answers, [server], log)
    grant = (
        "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
    )
    subprocess.run([*client, "-e", grant], check=True, capture_output=True, timeout=30)
    return server, port


def _start_slurmdbd(root: Path, mariadb_port: int) -> tuple[subprocess.Popen[bytes], int]:
    """slurmdbd in the foreground; it reads slurmdbd.conf from SLURM_CONF's folder (it has no -f)."""
    port, log = free_port(), root / "log" / "slurmdbd.log"
    conf = root / "slurmdbd.conf"
    conf.write_text(
        f"""AuthType=auth/none
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={port}
SlurmUser=root
LogFile={log}
PidFile={root / "slurmdbd.pid"}
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={mariadb_port}
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
"""
    )
    conf.chmod(0o600)  # slurmdbd refuses a configuration others can read (it holds the password)
    slurmdbd = shutil.which("slurmdbd", path=SBIN_PATH)
    assert slurmdbd is not None
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    process = subprocess.Popen([slurmdbd, "-D"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def listening() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    _wait_for("slurmdbd", listening, [process], log)
    return process, port


@pytest.fixture(scope="session")
def slurm_accounting_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A one-node cluster whose finished jobs are in slurmdbd (MariaDB), as on clusters with accounting: sacct
    answers, and the job-completion log is not written at all."""
    _ensure_slurm_installed()
    if not all(shutil.which(p, path=SBIN_PATH) for p in ("slurmdbd", "mariadbd", "mariadb-install-db", "mariadb")):
        apt_install(*ACCOUNTING_PACKAGES)
    if not (_has_plugin("auth_none") and _has_plugin("cred_none")):
        pytest.skip("slurmdbd is wired here for auth/none only, which this Slurm lacks")
    root = tmp_path_factory.mktemp("slurmdb")
    (root / "log").mkdir()
    servers: list[subprocess.Popen[bytes]] = []
    try:
        mariadb, mariadb_port = _start_mariadb(root)
        servers.append(mariadb)
        slurmdbd, dbd_port = _start_slurmdbd(root, mariadb_port)
        servers.append(slurmdbd)
        accounting = (
            "AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\n"
            f"AccountingStoragePort={dbd_port}\nJobAcctGatherType=jobacct_gather/none\nJobCompType=jobcomp/none"
        )
        with running_cluster(root, (_machine_name(),), name="clusterx-acct", accounting=accounting) as cluster:
            yield cluster
    finally:
        for server in reversed(servers):
            _stop(server)
