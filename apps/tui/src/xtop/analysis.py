"""`deeptrace analyze` run in the background for the trace screen.

The analysis is CPU-heavy: it runs as its own process (never in the dashboard's, whose screen must keep
drawing), started through deeptrace's command line so xtop needs nothing but its output files. Progress is what
the command says on stderr, line by line, and the time it has taken.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

EXIT_BAD_INPUT = 2  # deeptrace's exit status for an input it refuses (its message is the last stderr line)
_DEEPTRACE = "import sys; from deeptrace.cli import main; sys.exit(main())"


@dataclass
class Analysis:
    run_dir: Path
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    returncode: int | None = None
    lines: list[str] = field(default_factory=list)  # stderr of the command
    _process: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.returncode is None

    @property
    def elapsed_s(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    @property
    def failure(self) -> str | None:
        """None while it runs or when it succeeded (exit status 0); else what it said last on stderr (deeptrace
        ends a refusal with its one-line message, exit status 2), with the exit status."""
        if self.returncode in (None, 0):
            return None
        said = [line for line in self.lines if line.strip()]
        if self.returncode == EXIT_BAD_INPUT and said:
            return said[-1]
        status = f"deeptrace analyze exited with status {self.returncode}"
        return f"{said[-1]} ({status})" if said else status

    def cancel(self) -> None:
        if self._process is not None and self.returncode is None:
            self._process.terminate()


def start_analysis(run_dir: Path) -> Analysis:
    """Start `deeptrace analyze RUN_DIR --no-png`; a thread collects its stderr and its exit status."""
    analysis = Analysis(run_dir)
    process = subprocess.Popen(
        [sys.executable, "-c", _DEEPTRACE, "analyze", str(run_dir), "--no-png"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    analysis._process = process

    def collect() -> None:
        assert process.stderr is not None
        for raw in process.stderr:
            analysis.lines.append(raw.decode("utf-8", errors="replace").rstrip())
        analysis.returncode = process.wait()
        analysis.ended = time.monotonic()

    threading.Thread(target=collect, name="xtop-analysis", daemon=True).start()
    return analysis
