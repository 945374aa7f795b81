"""A rank's stacks: read from outside with py-spy, or written by the rank itself on a signal (faulthandler).

py-spy attaches with ptrace and sees Python frames with the native frames between them (`--native`): the best
picture, where the kernel allows it. Where it does not (ptrace refused: another user, a non-dumpable process, a
container without CAP_SYS_PTRACE, Yama), the signal method asks the rank's own faulthandler (installed by the
Collector, see `deeptrace.collect.stackdump`) for its Python stacks. `capture_stack` tries them in that order.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from deeptrace.rundir import layout
from deeptrace.rundir.records import Heartbeat

Method = Literal["auto", "py-spy", "signal"]
METHODS: tuple[Method, ...] = ("auto", "py-spy", "signal")
PY_SPY_TIMEOUT_S = 15.0
SIGNAL_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Frame:
    function: str
    file: str
    line: int
    native: bool = False  # a C/C++ frame (py-spy --native): file is the shared library, line 0

    def where(self) -> str:
        return self.file if self.native else f"{self.file}:{self.line}"

    def __str__(self) -> str:
        return f"{self.function} ({self.where()})"


@dataclass(frozen=True, slots=True)
class ThreadStack:
    thread_id: int | None  # threading.get_ident() (pthread id)
    name: str | None
    frames: list[Frame]  # innermost first

    def python_frames(self) -> list[Frame]:
        return [f for f in self.frames if not f.native]


@dataclass(frozen=True, slots=True)
class StackSnapshot:
    rank: int
    wall_s: float
    method: Literal["py-spy", "signal"]
    threads: list[ThreadStack]
    notes: list[str] = field(default_factory=list)  # e.g. why the first method failed

    def thread(self, thread_id: int | None) -> ThreadStack | None:
        """The training thread (by id), else the main thread, else the first one."""
        for stack in self.threads:
            if thread_id is not None and stack.thread_id == thread_id:
                return stack
        return self.threads[0] if self.threads else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> StackSnapshot:
        threads = [ThreadStack(t["thread_id"], t["name"], [Frame(**f) for f in t["frames"]]) for t in obj["threads"]]
        return cls(obj["rank"], obj["wall_s"], obj["method"], threads, list(obj.get("notes", [])))


class StackError(RuntimeError):
    """No stack could be read; the message says why (each method tried)."""


def py_spy_binary() -> str | None:
    """py-spy beside this interpreter (the package depends on it), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def capture_py_spy(rank: int, pid: int, *, native: bool = True) -> StackSnapshot:
    """`native`: with the C frames too (a second or more on a large library such as libtorch: its symbols are
    read); without, Python frames only (tens of milliseconds)."""
    binary = py_spy_binary()
    if binary is None:
        raise StackError("py-spy is not installed")
    wall = time.time()
    notes: list[str] = []
    # --native first (C frames between the Python ones); some processes cannot be unwound: then Python only.
    for args in (["--native"], []) if native else ([],):
        try:
            done = subprocess.run(
                [binary, "dump", "--pid", str(pid), "--json", *args],
                capture_output=True,
                timeout=PY_SPY_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise StackError(f"py-spy dump --pid {pid} did not answer within {PY_SPY_TIMEOUT_S:.0f} s") from None
        if done.returncode == 0:
            return StackSnapshot(rank, wall, "py-spy", _parse_py_spy(done.stdout), notes)
        problem = _first_line(done.stderr) or f"exit code {done.returncode}"
        if "ermission" in problem or not args:
            raise StackError(f"py-spy cannot read process {pid}: {problem}")
        notes.append(f"py-spy --native failed ({problem}); Python frames only")
    raise StackError(f"py-spy cannot read process {pid}")  # not reached: the second try returns or raises


def _first_line(data: bytes) -> str:
    for line in data.decode(errors="replace").splitlines():
        if line.strip():
            return line.strip()
    return ""


def _parse_py_spy(data: bytes) -> list[ThreadStack]:
    threads = []
    for thread in orjson.loads(data):
        frames = [
            Frame(
                function=str(f.get("name") or "?"),
                file=str(f.get("filename") or f.get("short_filename") or "?"),
                line=int(f.get("line") or 0),
                native=f.get("module") is not None,
            )
            for f in thread.get("frames", [])
        ]
        threads.append(ThreadStack(thread.get("thread_id"), thread.get("thread_name"), frames))
    return threads


_THREAD_LINE = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME_LINE = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def parse_faulthandler(text: str) -> list[ThreadStack]:
    """faulthandler's dump_traceback text (all threads, innermost frame first) as ThreadStacks."""
    threads: list[ThreadStack] = []
    current: list[Frame] | None = None
    ident: int | None = None
    for line in text.splitlines():
        head = _THREAD_LINE.match(line)
        if head:
            if current is not None:
                threads.append(ThreadStack(ident, None, current))
            ident, current = int(head.group(1), 16), []
            continue
        frame = _FRAME_LINE.match(line)
        if frame and current is not None:
            current.append(Frame(function=frame.group(3), file=frame.group(1), line=int(frame.group(2))))
    if current is not None:
        threads.append(ThreadStack(ident, None, current))
    return threads


def capture_signal(run_dir: Path, rank: int, pid: int, signum: int | None) -> StackSnapshot:
    """Ask the rank's own faulthandler (installed by the Collector) for its stacks, and read what it appended."""
    if signum is None:
        raise StackError("the rank installed no in-process stack dump (Collector stack_signal=None)")
    path = layout.stack_dump_path(run_dir, rank)
    before = path.stat().st_size if path.exists() else 0
    wall = time.time()
    try:
        os.kill(pid, signum)
    except OSError as error:
        raise StackError(f"cannot signal process {pid}: {error.strerror}") from None
    # faulthandler writes in a few syscalls from the signal handler: wait for growth, then for it to settle.
    deadline = time.monotonic() + SIGNAL_TIMEOUT_S
    size, stable_since = before, None
    while time.monotonic() < deadline:
        now_size = path.stat().st_size if path.exists() else 0
        if now_size != size:
            size, stable_since = now_size, time.monotonic()
        elif size > before and stable_since is not None and time.monotonic() - stable_since > 0.15:
            break
        time.sleep(0.02)
    if size <= before:
        raise StackError(f"process {pid} wrote no stack dump to {path} within {SIGNAL_TIMEOUT_S:.0f} s")
    with path.open("rb") as handle:
        handle.seek(before)
        text = handle.read(size - before).decode(errors="replace")
    return StackSnapshot(rank, wall, "signal", parse_faulthandler(text))


def capture_stack(
    run_dir: Path, heartbeat: Heartbeat, method: Method = "auto", *, native: bool = True
) -> StackSnapshot:
    """One snapshot of a local rank's stacks by `method`; `auto`: py-spy, then the signal when ptrace is refused.

    `native`: py-spy also reads the C frames (the first snapshot of a series; the later ones compare Python frames).
    """
    rank, pid = heartbeat.rank, heartbeat.pid
    if method == "signal":
        return capture_signal(run_dir, rank, pid, heartbeat.stack_signal)
    try:
        return capture_py_spy(rank, pid, native=native)
    except StackError as error:
        if method == "py-spy":
            raise
        try:
            snapshot = capture_signal(run_dir, rank, pid, heartbeat.stack_signal)
        except StackError as second:
            raise StackError(f"{error}; in-process dump: {second}") from None
        return StackSnapshot(snapshot.rank, snapshot.wall_s, snapshot.method, snapshot.threads, [str(error)])
