"""Fixtures of the clusterx tests: a database of each kind (SQLite file, and a real PostgreSQL server started
for the session), a client on it, and daemons that are always stopped after the test."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.debian_packages import apt_install


def _postgres_bin() -> Path | None:
    """The newest PostgreSQL server binaries Debian installed (/usr/lib/postgresql/<major>/bin), if any."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    return found[-1].parent if found else None


def _ensure_postgres_bin() -> Path:
    """PostgreSQL's server binaries, installed from Debian's packages when missing (we run as root in CI)."""
    found = _postgres_bin()
    if found is None:
        apt_install("postgresql")
        found = _postgres_bin()
    if found is None:
        pytest.fail("PostgreSQL server binaries not found in /usr/lib/postgresql/*/bin (apt-get install postgresql)")
    return found


# Daemons started by tests exit by themselves after this much idle time, should a test crash past its cleanup.
TEST_DAEMON_IDLE_EXIT_S = "120"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_postgres_user(argv: list[str]) -> list[str]:
    """initdb refuses to run as root: run the server's commands as the `postgres` user when we are root."""
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A PostgreSQL 15 server on a free port of 127.0.0.1 (trust auth), for the whole session.
    Yields the URL prefix `postgresql://postgres@127.0.0.1:PORT`."""
    pg_bin = _ensure_postgres_bin()
    root = Path(tempfile.mkdtemp(prefix="clusterx-pg-"))
    data, sockets = root / "data", root / "sockets"
    sockets.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        shutil.chown(sockets, "postgres", "postgres")
    port = _free_port()
    subprocess.run(
        _as_postgres_user([str(pg_bin / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8"]),
        check=True,
        capture_output=True,
        timeout=120,
    )
    options = f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    start = [str(pg_bin / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-o", options, "-w", "start"]
    subprocess.run(_as_postgres_user(start), check=True, capture_output=True, timeout=120)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}"
    finally:
        stop = [str(pg_bin / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]
        subprocess.run(_as_postgres_user(stop), check=False, capture_output=True, timeout=120)
        shutil.rmtree(root, ignore_errors=True)


def new_postgres_database(server: str) -> str:
    import psycopg

    name = f"clusterx_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return f"{server}/{name}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database: a SQLite file, or a new database on the session's PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "clusterx.db")
    return new_postgres_database(request.getfixturevalue("postgres_server"))


@pytest.fixture
def sqlite_db(tmp_path: Path) -> str:
    return str(tmp_path / "clusterx.db")


@pytest.fixture
def daemon_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Daemons started in this test exit on their own when idle (a safety net beside `stop_daemons`)."""
    monkeypatch.setenv("CLUSTERX_DAEMON_IDLE_EXIT", TEST_DAEMON_IDLE_EXIT_S)


@pytest.fixture
def stop_daemons(daemon_env: None) -> Iterator[Callable[[str], None]]:
    """Register a database whose daemon must be stopped (and its jobs' process groups killed) after the test."""
    from clusterx.daemon.control import stop_daemon
    from clusterx.db.engine import resolve_db_url

    urls: list[str] = []
    yield lambda db: urls.append(resolve_db_url(db))
    for url in urls:
        stop_daemon(url)
        _kill_job_groups(url)


def _kill_job_groups(url: str) -> None:
    """Kill every local job process group this database recorded (jobs outlive their daemon by design)."""
    import signal

    from clusterx.daemon.launch import same_process_alive
    from clusterx.store import JobStore

    store = JobStore(url)
    try:
        for job in store.list_jobs(limit=None):
            for attempt in store.attempts(job.id):
                if attempt.pgid and attempt.pid and same_process_alive(attempt.pid, attempt.proc_start_time or 0):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(attempt.pgid, signal.SIGKILL)
    finally:
        store.close()


def wait_until(predicate: Callable[[], bool], timeout_s: float = 30.0, interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"condition not met within {timeout_s} s")


CURRENT_USER = getpass.getuser()


# A second Unix user for the ownership tests (created once, left in place: a system account without home or login).
OTHER_USER = "clusterx-other"


@pytest.fixture(scope="session")
def other_user() -> str:
    """The name of a real second Unix user, created with useradd when missing (we run as root in CI)."""
    import pwd

    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("a second Unix user is created with useradd, which needs root")
    try:
        pwd.getpwnam(OTHER_USER)
    except KeyError:
        created = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
            capture_output=True,
            text=True,
            check=False,
        )
        if created.returncode not in (0, 9):  # 9: another test process created it meanwhile
            pytest.fail(f"useradd {OTHER_USER} failed: {created.stderr}")
    return OTHER_USER


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder another user can enter (pytest's own tmp_path lies under a 0700 folder)."""
    folder = Path(tempfile.mkdtemp(prefix="clusterx-shared-", dir="/tmp"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
