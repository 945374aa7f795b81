"""The newest jobs of a SQLite job history, read with the standard library alone: for a tool's first paint.

`clusterx.Client` loads SQLAlchemy and pydantic, about a quarter of a second on the development VM before it
reads a row; a dashboard that wants its first screen to show jobs (xtop) reads them here instead, in a few
milliseconds, and reads `JobRecord`s through the client afterwards. A `JobGlance` holds the fields a listing
shows, read from the columns of the same names (and three keys of the stored spec); a test checks that they agree
with the `JobRecord` of every job. Only SQLite files can be glanced at: for any other database, and for a file
that cannot be read now (missing, locked, older than the columns read here), `newest_jobs` returns None and the
caller reads through the client.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime

from clusterx.paths import resolve_db_url, sqlite_path
from clusterx.states import JobState

_COLUMNS = (
    "id, name, user, state, backend, spec, attempt, max_retries, created_at, started_at, ended_at, run_dir, "
    "hosts, failure_reason, updated_at"
)


@dataclass(frozen=True)
class JobGlance:
    """What a listing shows of one job; the same values as its `JobRecord` (`spec.*` for the resources)."""

    id: int
    name: str
    user: str
    state: JobState
    backend: str
    nodes: int
    gpus_per_node: int
    procs_per_node: int
    attempt: int
    max_retries: int
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    run_dir: str
    hosts: tuple[str, ...]
    failure_reason: str | None
    updated_at: datetime


def newest_jobs(db: str | None, limit: int) -> list[JobGlance] | None:
    """The newest `limit` jobs, newest first; None where this database cannot be glanced at (see module doc)."""
    path = sqlite_path(resolve_db_url(db))
    if path is None or not path.is_file():
        return None if path is None else []
    try:
        connection = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=0.2)
        try:
            query = f"SELECT {_COLUMNS} FROM jobs ORDER BY id DESC LIMIT ?"
            rows = connection.execute(query, (limit,)).fetchall()
        finally:
            connection.close()
        return [_glance(row) for row in rows]
    except (sqlite3.Error, ValueError, KeyError, TypeError):
        return None  # locked, not yet created, or not what this clusterx wrote: the client will say what it is


def _glance(row: tuple[object, ...]) -> JobGlance:
    job_id, name, user, state, backend, spec_json, attempt, max_retries, created, started, ended, run_dir = row[:12]
    hosts_json, failure_reason, updated = row[12:]
    spec = json.loads(str(spec_json))
    return JobGlance(
        id=int(str(job_id)),
        name=str(name),
        user=str(user),
        state=JobState(str(state)),
        backend=str(backend),
        nodes=int(spec.get("nodes", 1)),
        gpus_per_node=int(spec.get("gpus_per_node", 0)),
        procs_per_node=int(spec.get("procs_per_node", 1)),
        attempt=int(str(attempt)),
        max_retries=int(str(max_retries)),
        created_at=_utc(created),
        started_at=None if started is None else _utc(started),
        ended_at=None if ended is None else _utc(ended),
        run_dir=str(run_dir),
        hosts=tuple(json.loads(str(hosts_json))),
        failure_reason=None if failure_reason is None else str(failure_reason),
        updated_at=_utc(updated),
    )


def _utc(value: object) -> datetime:
    """A stored timestamp: SQLAlchemy writes naive UTC text on SQLite (clusterx.db.models.UTCDateTime)."""
    return datetime.fromisoformat(str(value)).replace(tzinfo=UTC)
