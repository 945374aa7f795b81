"""How an attempt ended → the job's state, exit code and failure reason."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from clusterx.daemon import wrapper
from clusterx.states import JobState

KillReason = Literal["cancel", "timeout"]


@dataclass(frozen=True)
class Outcome:
    state: JobState
    exit_code: int | None
    reason: str | None
    raw_state: str


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def read_exit_file(directory: Path) -> tuple[int, str | None] | None:
    """(returncode, reason) the wrapper wrote, None when it wrote nothing (still running, or killed itself)."""
    try:
        data = json.loads((directory / wrapper.EXIT_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return int(data["returncode"]), data.get("reason")


def outcome(returncode: int | None, kill_reason: KillReason | None, time_limit_s: int | None) -> Outcome:
    """`returncode` as Popen reports it (negative: killed by that signal); None when no status was recorded."""
    exit_code = None if returncode is None else (returncode if returncode >= 0 else 128 - returncode)
    if kill_reason == "cancel":
        return Outcome(JobState.CANCELLED, exit_code, "cancelled by its user", "CANCELLED")
    if kill_reason == "timeout":
        return Outcome(JobState.TIMEOUT, exit_code, f"time limit of {time_limit_s} s reached", "TIMEOUT")
    if returncode is None:
        return Outcome(JobState.LOST, None, "the job's process ended without recording its exit status", "LOST")
    if returncode == 0:
        return Outcome(JobState.SUCCEEDED, 0, None, "EXITED")
    if returncode < 0:
        return Outcome(
            JobState.FAILED, exit_code, f"killed by signal {-returncode} ({signal_name(-returncode)})", "SIGNALED"
        )
    return Outcome(JobState.FAILED, exit_code, f"exited with status {returncode}", "EXITED")
