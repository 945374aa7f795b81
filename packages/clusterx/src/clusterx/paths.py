"""Where clusterx puts things on disk (kept free of heavy imports: the CLI reads it)."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

from clusterx.errors import DatabaseConfigError


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


def resolve_db_url(db: str | None = None) -> str:
    """--db, else CLUSTERX_DB, else the SQLite file in the data directory. A plain path means a SQLite file."""
    value = db or os.environ.get("CLUSTERX_DB") or str(default_data_dir() / "clusterx.db")
    if "://" not in value:
        return f"sqlite:///{Path(value).expanduser().resolve()}"
    scheme, _, rest = value.partition("://")
    if scheme in ("postgres", "postgresql"):
        return f"postgresql+psycopg://{rest}"  # psycopg 3 is the driver clusterx declares
    if scheme not in ("sqlite", "postgresql+psycopg"):
        raise DatabaseConfigError(
            f"database URL scheme {scheme!r} is not supported; use a file path, sqlite:///PATH or postgresql://..."
        )
    return value


def sqlite_path(url: str) -> Path | None:
    """The file behind a SQLite URL, None for other databases (or an in-memory SQLite)."""
    if not url.startswith("sqlite:///"):
        return None
    path = url.removeprefix("sqlite:///")
    return None if path in ("", ":memory:") else Path(path)


def lock_path(url: str) -> Path:
    # Parsing the URL through clusterx.db.engine would import SQLAlchemy; a prefix test is enough here.
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///") + ".daemon.lock")
    return default_data_dir() / f"daemon-{zlib.crc32(url.encode()):08x}.lock"
