"""Start, stop and find the daemon of a database. One daemon per database and machine: it holds an exclusive
lock on a file beside the SQLite database (for PostgreSQL, in the data directory, named after the URL), and
writes its pid into that file. The URL travels to the daemon in its environment, never on its command line
(it may carry a password)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from clusterx.errors import BackendError
from clusterx.paths import lock_path

__all__ = ["daemon_pid", "lock_path", "log_path", "start_daemon", "stop_daemon"]

# The daemon writes its pid once its socket listens (after loading SQLAlchemy and opening the database): on a
# loaded machine that takes seconds.
START_TIMEOUT_S = 60.0


def log_path(url: str) -> Path:
    return lock_path(url).with_suffix(".log")


def daemon_pid(url: str) -> int | None:
    """The pid of the daemon holding this database's lock, None when no daemon runs."""
    path = lock_path(url)
    if not path.exists():
        return None
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            text = handle.read().strip()
            return int(text) if text.isdigit() else -1  # locked, pid not written yet
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None


def start_daemon(url: str, idle_exit_s: float | None = None, wait_s: float = START_TIMEOUT_S) -> int:
    """Start the daemon when none runs; returns its pid once it listens on its socket."""
    pid = daemon_pid(url)
    if pid is not None and pid > 0:
        return pid
    path = log_path(url)
    path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CLUSTERX_DB": url}
    if idle_exit_s is not None:
        env["CLUSTERX_DAEMON_IDLE_EXIT"] = str(idle_exit_s)
    with path.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "clusterx.daemon"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            start_new_session=True,  # its own session: the caller's Ctrl-C or exit does not reach it
            close_fds=True,
        )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        pid = daemon_pid(url)
        if pid is not None and pid > 0:
            return pid
        if process.poll() is not None:
            # Another daemon may have won the race for the lock; then that one serves us.
            pid = daemon_pid(url)
            if pid is not None and pid > 0:
                return pid
            raise BackendError(f"the clusterx daemon exited at start (status {process.returncode}); see {path}")
        time.sleep(0.02)
    raise BackendError(f"the clusterx daemon did not start within {wait_s:.0f} s; see {path}")


def stop_daemon(url: str, timeout_s: float = 10.0) -> int | None:
    """Stop the daemon (SIGTERM, then SIGKILL after `timeout_s`); its jobs keep running and are adopted by
    the next daemon. Returns the pid stopped, None when none ran."""
    pid = daemon_pid(url)
    if pid is None or pid <= 0:
        return None
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return pid
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if daemon_pid(url) is None:
                return pid
            time.sleep(0.02)
    raise BackendError(f"daemon {pid} did not stop")
