"""Running the real thing for the watch tests: a 4-rank gloo job (watch_worker.py) and `deeptrace watch`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
from deeptrace.rundir import layout, read_heartbeats

WORKER = Path(__file__).with_name("watch_worker.py")
DEEPTRACE = [str(Path(sys.executable).with_name("deeptrace"))]
WORLD = 4
THRESHOLD_S = 3.0
# Short, so the tests finish quickly: a look every 0.5 s, three stack snapshots 0.5 s apart.
FAST = ["--threshold", str(THRESHOLD_S), "--interval", "0.5", "--snapshots", "3", "--snapshot-gap", "0.5"]


def marked_line(marker: str) -> int:
    """The line of watch_worker.py that carries `# MARKER` (where the planted problem waits)."""
    for number, line in enumerate(WORKER.read_text().splitlines(), start=1):
        if line.rstrip().endswith(f"# {marker}"):
            return number
    raise AssertionError(f"no line marked {marker} in {WORKER}")


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k != "DEEPTRACE_HOST"}
    out.update(extra)
    return out


def start(args: list[str], log: Path, *, user: int | None = None, **extra: str) -> subprocess.Popen[bytes]:
    """A process in its own session (so the whole group can be killed), output to `log`."""
    if user is not None:
        # setpriv (util-linux) rather than Popen(user=...): the latter's exec of the venv's interpreter, a link
        # into root's home, is refused here, while setpriv's is not.
        args = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *args]
    with log.open("wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env(**extra), start_new_session=True)


def start_job(run_dir: Path, scenario: str, culprit: int, *, hosts: str = "", user: int | None = None,
              **extra: str) -> subprocess.Popen[bytes]:  # fmt: skip
    args = [sys.executable, str(WORKER), str(run_dir), str(WORLD), scenario, str(culprit)]
    return start([*args, hosts] if hosts else args, run_dir.parent / f"{run_dir.name}-job.log", user=user, **extra)


def start_watch(run_dir: Path, *more: str, user: int | None = None, **extra: str) -> subprocess.Popen[bytes]:
    log = run_dir.parent / f"{run_dir.name}-watch.log"
    return start([*DEEPTRACE, "watch", str(run_dir), *FAST, *more], log, user=user, **extra)


def stop(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.wait(timeout=30)


@contextlib.contextmanager
def running(*procs: subprocess.Popen[bytes]) -> Iterator[None]:
    try:
        yield
    finally:
        stop(*procs)


def wait_for(
    what: str, check: Callable[[], object], timeout_s: float, procs: tuple[subprocess.Popen[bytes], ...] = ()
) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        for proc in procs:
            assert proc.poll() is None, f"{proc.args} exited with {proc.returncode} before {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(0.1)


def wait_for_verdict(
    run_dir: Path, timeout_s: float, procs: tuple[subprocess.Popen[bytes], ...]
) -> tuple[dict[str, Any], float]:
    """The first verdict.json and how long after the planted problem began it was written."""
    wait_for("a verdict", lambda: layout.hang_dirs(run_dir), timeout_s, procs)
    folder = layout.hang_dirs(run_dir)[0]
    verdict = orjson.loads((folder / layout.VERDICT_FILE).read_bytes())
    planted = float((run_dir / "planted").read_text())
    return verdict, (folder / layout.VERDICT_FILE).stat().st_mtime - planted


def started(run_dir: Path, min_step: int = 0) -> bool:
    beats = read_heartbeats(run_dir, errors={})
    return len(beats) == WORLD and all((b.step or 0) >= min_step for b in beats.values())


def shared_run_dir(name: str) -> Path:
    """A run directory (in a fresh folder of its own) that another Unix user can write: for the tests that run
    as `nobody`, whose pytest tmp_path (inside root's 0700 folder) that user cannot reach."""
    base = Path(tempfile.mkdtemp(prefix=f"deeptrace-watch-{name}-"))
    base.chmod(0o777)
    run = base / "run"
    run.mkdir()
    run.chmod(0o777)
    return run
