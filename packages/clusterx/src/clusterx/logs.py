"""Reading a job's output: whole files, filtered by a pattern, or followed while the job runs."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path


def read_lines(path: Path, pattern: re.Pattern[str] | None = None) -> Iterator[str]:
    if not path.exists():
        return
    with path.open(errors="replace") as handle:
        for line in handle:
            if pattern is None or pattern.search(line):
                yield line


def follow_lines(
    path: Path,
    is_live: Callable[[], bool],
    pattern: re.Pattern[str] | None = None,
    interval_s: float = 0.5,
) -> Iterator[str]:
    """Lines of `path` as they are written, until the job ends and everything is read. A partly written last
    line is held back until it is complete (or the job has ended)."""
    position = 0
    pending = ""
    while True:
        live = is_live()  # asked before reading, so nothing written just before the end is missed
        if path.exists():
            with path.open(errors="replace") as handle:
                handle.seek(position)
                chunk = handle.read()
                position = handle.tell()
            pending += chunk
            *complete, pending = pending.split("\n")
            for line in complete:
                if pattern is None or pattern.search(line):
                    yield line + "\n"
        if not live:
            if pending and (pattern is None or pattern.search(pending)):
                yield pending
            return
        time.sleep(interval_s)
