"""Where clusterx puts things on disk (kept free of heavy imports: the CLI reads it)."""

from __future__ import annotations

import os
from pathlib import Path


def default_data_dir() -> Path:
    """$XDG_DATA_HOME/clusterx (~/.local/share/clusterx): the default database and run directories live here."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "clusterx"


def default_runs_dir(db_url: str) -> Path:
    """CLUSTERX_RUNS_DIR, else `runs/` beside a SQLite database file, else `runs/` in the data directory."""
    if os.environ.get("CLUSTERX_RUNS_DIR"):
        return Path(os.environ["CLUSTERX_RUNS_DIR"])
    if db_url.startswith("sqlite:///"):
        return Path(db_url.removeprefix("sqlite:///")).parent / "runs"
    return default_data_dir() / "runs"


def attempt_dir(run_dir: str | Path, attempt: int) -> Path:
    """Per-attempt files of a job: stdout.log, stderr.log and the local wrapper's exit status."""
    return Path(run_dir) / "clusterx" / f"attempt-{attempt}"
