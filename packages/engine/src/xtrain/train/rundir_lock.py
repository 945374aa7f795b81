"""One owner per run directory: an OS lock on ``RUN_DIR/xtrain.lock`` held by the live run's launcher.

``xtrain train --nproc N`` takes an exclusive ``flock`` on the file before it starts torchrun and holds it until
the job has ended; torchrun's agent inherits the open file (so the lock outlives a launcher killed alone, for as
long as the agent lives, and the agent dies with it: :mod:`.lifeline`). The kernel drops a flock when the last
process holding the file goes, however it went, so the lock is never stale and nothing needs cleaning up after a
crash; the file itself stays (removing it would let two runs lock two different files). It holds the pid of the
launcher that took it, for the message a second run gets: that run is refused, naming the directory and the pid,
before it writes anything (exit code 2).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from xtrain.errors import XtrainError

LOCK_FILE = "xtrain.lock"


class RunDirInUseError(XtrainError):
    """Another live run holds the run directory's lock."""


def lock_path(run_dir: Path) -> Path:
    return run_dir / LOCK_FILE


class RunDirLock:
    """The lock of a run directory, held from :meth:`acquire` until :meth:`release` or this process's end."""

    def __init__(self, run_dir: Path, fd: int) -> None:
        self.run_dir = run_dir
        self.fd = fd
        """The open lock file: pass it to a child (``pass_fds``) and the child holds the lock too."""

    @classmethod
    def acquire(cls, run_dir: Path) -> RunDirLock:
        """Lock ``run_dir`` (created if need be) for this process; RunDirInUseError if a live run holds it."""
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path(run_dir), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _in_use(run_dir) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(run_dir, fd)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the last descriptor of the open file drops the flock
            self.fd = -1

    def __enter__(self) -> RunDirLock:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


def refuse_if_in_use(run_dir: Path) -> None:
    """RunDirInUseError if a live run holds ``run_dir``'s lock; reads only (a directory without a lock file has
    no live run: every run that locks creates the file first)."""
    try:
        fd = os.open(lock_path(run_dir), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(run_dir) from None
    finally:
        os.close(fd)


def _in_use(run_dir: Path) -> RunDirInUseError:
    holder = _holder_pid(run_dir)
    who = f"pid {holder}" if holder is not None else "a process whose pid is not written yet"
    return RunDirInUseError(
        f"run directory {run_dir} is in use by a live run ({who} holds {lock_path(run_dir)}): wait for it to "
        "end or stop it, or choose another --run-dir"
    )


def _holder_pid(run_dir: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        text = lock_path(run_dir).read_text().strip()
        return int(text) if text else None
    return None
