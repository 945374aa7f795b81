"""clusterx's jobs as the dashboard holds them: a cache kept current by incremental reads, a typed query, sorting.

Reading every job each tick does not scale (clusterx builds a record per job: about 1.2 s for 10,000 jobs on the
development VM), so the cache reads everything once and then, each tick, only what can have changed: the live
jobs, the jobs that stopped being live since the previous tick, and jobs newer than the newest one seen. That
rests on clusterx's rule that a terminal state never changes again.

`JobFeed.fetch` runs in a worker thread and returns a `JobDelta`; `JobTableModel.apply` runs on the UI thread, so
the rows the screen draws are never changed under it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from clusterx.states import LIVE_STATES

if TYPE_CHECKING:  # loaded with the client, after the first paint (see JobFeed._connect)
    from clusterx import Client
    from clusterx.record import JobRecord

# How many newest jobs one look asks for; doubled while every one of them is new (a burst of submissions).
NEWEST_BATCH = 32


@dataclass(frozen=True)
class JobRow:
    """The fields of a clusterx job record that the table shows or sorts by."""

    id: int
    name: str
    user: str
    state: str
    backend: str
    nodes: int
    gpus_per_node: int
    procs_per_node: int
    attempt: int
    max_retries: int
    created_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    run_dir: str | None
    hosts: tuple[str, ...]
    failure_reason: str | None

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    def age_s(self, now: datetime) -> float | None:
        return None if self.created_at is None else max(0.0, (now - self.created_at).total_seconds())

    def run_time_s(self, now: datetime) -> float | None:
        if self.started_at is None:
            return None
        end = self.ended_at or (now if self.live else self.started_at)
        return max(0.0, (end - self.started_at).total_seconds())

    @classmethod
    def from_record(cls, record: JobRecord) -> JobRow:
        return cls(
            id=record.id,
            name=record.name,
            user=record.user,
            state=record.state.value,
            backend=record.backend,
            nodes=record.spec.nodes,
            gpus_per_node=record.spec.gpus_per_node,
            procs_per_node=record.spec.procs_per_node,
            attempt=record.attempt,
            max_retries=record.max_retries,
            created_at=record.created_at,
            started_at=record.started_at,
            ended_at=record.ended_at,
            run_dir=record.run_dir,
            hosts=tuple(record.hosts),
            failure_reason=record.failure_reason,
        )


@dataclass
class JobDelta:
    """What one look at the database found: rows to add or replace, and why there are none, if it failed."""

    rows: list[JobRow] = field(default_factory=list)
    problem: str | None = None
    complete: bool = True  # False while the first full read is still to come (the first page shown meanwhile)
    warnings: list[str] = field(default_factory=list)


class JobFeed:
    """Reads jobs through `clusterx.Client`, incrementally after the first full read. One thread at a time."""

    def __init__(self, db: str | None, client_factory: Callable[[str | None], Client] | None = None) -> None:
        self.db = db
        self._client_factory = client_factory
        self._client: Client | None = None
        self._loaded = False
        self._newest_id = 0
        self._live_ids: set[int] = set()

    def _connect(self) -> Client:
        if self._client is None:
            if self._client_factory is not None:
                self._client = self._client_factory(self.db)
            else:
                from clusterx import Client  # noqa: PLC0415 (lazy: SQLAlchemy loads after the first paint)

                # xtop's tick sets the pace: polled backends (Slurm) are asked once per tick.
                self._client = Client(self.db, poll_interval_s=0.0)
        return self._client

    def first_page(self, limit: int = 200) -> JobDelta:
        """The newest jobs, quickly, for the first paint; `fetch` reads the rest."""
        return self._guarded(lambda client: self._remember(client.list(limit=limit, poll=False)), complete=False)

    def fetch(self) -> JobDelta:
        return self._guarded(self._fetch_changes)

    def _guarded(self, read: Callable[[Client], list[JobRow]], complete: bool = True) -> JobDelta:
        # The database layer raises its drivers' own errors (sqlite3, psycopg, SQLAlchemy, clusterx's): whatever
        # it is, the dashboard shows it and tries again next tick instead of ending.
        try:
            client = self._connect()
            rows = read(client)
        except Exception as error:
            self.close()
            return JobDelta(problem=f"job database unreachable: {_one_line(error)}", complete=False)
        warnings = list(client.poll_errors)
        return JobDelta(rows=rows, complete=complete, warnings=warnings)

    def _fetch_changes(self, client: Client) -> list[JobRow]:
        if not self._loaded:
            rows = self._remember(client.list(limit=None, poll=True))
            self._loaded = True
            return rows
        live = self._remember(client.list(states=LIVE_STATES, limit=None, poll=True))
        live_now = {row.id for row in live}
        # Jobs live at the previous look and not now have ended: read each one's final record.
        ended = [JobRow.from_record(client.describe(job_id, poll=False)) for job_id in self._live_ids - live_now]
        self._live_ids |= live_now
        self._live_ids -= {row.id for row in ended}
        return live + ended + self._newer(client)

    def _newer(self, client: Client) -> list[JobRow]:
        newest = client.list(limit=1, poll=False)  # the common case, nothing new, costs one row
        if not newest or newest[0].id <= self._newest_id:
            return []
        limit = NEWEST_BATCH
        while True:
            records = client.list(limit=limit, poll=False)
            if len(records) < limit or records[-1].id <= self._newest_id:
                break
            limit *= 2
        return self._remember([record for record in records if record.id > self._newest_id])

    def _remember(self, records: Iterable[JobRecord]) -> list[JobRow]:
        rows = [JobRow.from_record(record) for record in records]
        for row in rows:
            self._newest_id = max(self._newest_id, row.id)
            if row.live:
                self._live_ids.add(row.id)
        return rows

    @property
    def client(self) -> Client:
        """The clusterx client, for actions (cancel, retry, logs); connects on first use."""
        return self._connect()

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


# -- query and sort ---------------------------------------------------------------------------------------------
QUERY_KEYS = ("id", "name", "user", "state", "backend")


@dataclass(frozen=True)
class JobQuery:
    """A typed filter: words separated by spaces, all of which must match.

    `key:value` matches one field (id exactly; name, user, backend as a substring; state as a prefix, so
    `state:run` is RUNNING); a bare word matches a substring of the name, user, state or backend. Case is ignored.
    An unknown key makes the whole query a problem (shown), never an exception.
    """

    terms: tuple[tuple[str | None, str], ...] = ()
    problem: str | None = None
    text: str = ""

    @classmethod
    def parse(cls, text: str) -> JobQuery:
        terms: list[tuple[str | None, str]] = []
        for word in text.split():
            key, sep, value = word.partition(":")
            if not sep:
                terms.append((None, word.lower()))
                continue
            if key.lower() not in QUERY_KEYS:
                return cls((), f"unknown filter key {key!r}: use {', '.join(QUERY_KEYS)}", text)
            if key.lower() == "id" and not value.isdigit():
                return cls((), f"id:{value}: not a job number", text)
            terms.append((key.lower(), value.lower()))
        return cls(tuple(terms), None, text)

    def matches(self, row: JobRow) -> bool:
        return all(_term_matches(key, value, row) for key, value in self.terms)


def _term_matches(key: str | None, value: str, row: JobRow) -> bool:
    if key is None:
        return any(value in text.lower() for text in (row.name, row.user, row.state, row.backend))
    if key == "id":
        return row.id == int(value)
    if key == "state":
        return row.state.lower().startswith(value)
    text: str = getattr(row, key)
    return value in text.lower()


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SORT_KEYS: dict[str, Callable[[JobRow], Any]] = {
    "id": lambda row: row.id,
    "name": lambda row: (row.name, row.id),
    "user": lambda row: (row.user, row.id),
    "state": lambda row: (row.state, row.id),
    "age": lambda row: (row.created_at or _EPOCH, row.id),
    "run time": lambda row: (
        ((row.ended_at or datetime.now(UTC)) - row.started_at).total_seconds() if row.started_at else -1.0,
        row.id,
    ),
}
SORT_ORDER = tuple(SORT_KEYS)


class JobTableModel:
    """Every job seen, and the ids the table shows: filtered by the query, sorted by the chosen key."""

    def __init__(self) -> None:
        self.rows: dict[int, JobRow] = {}
        self.query = JobQuery()
        self.sort_key = "id"
        self.descending = True
        self.order: list[int] = []
        self.problem: str | None = None
        self.warnings: list[str] = []
        self.loaded = False
        self.live_count = 0

    def apply(self, delta: JobDelta) -> bool:
        """Take in one look's result; True when what the table shows may have changed."""
        self.problem = delta.problem
        self.warnings = delta.warnings
        self.loaded = self.loaded or (delta.complete and delta.problem is None)
        changed = False
        for row in delta.rows:
            if self.rows.get(row.id) != row:
                self.rows[row.id] = row
                changed = True
        if changed:
            self.live_count = sum(1 for row in self.rows.values() if row.live)
            self.reorder()
        return changed

    def set_query(self, text: str) -> None:
        self.query = JobQuery.parse(text)
        self.reorder()

    def cycle_sort(self) -> None:
        self.sort_key = SORT_ORDER[(SORT_ORDER.index(self.sort_key) + 1) % len(SORT_ORDER)]
        self.reorder()

    def flip_order(self) -> None:
        self.descending = not self.descending
        self.reorder()

    def reorder(self) -> None:
        query = self.query
        if self.sort_key == "id":  # the default: sorting the ids themselves is several times faster
            ids = self.rows if not query.terms else [i for i, row in self.rows.items() if query.matches(row)]
            self.order = sorted(ids, reverse=self.descending)
            return
        shown = self.rows.values() if not query.terms else [row for row in self.rows.values() if query.matches(row)]
        key = SORT_KEYS[self.sort_key]
        self.order = [row.id for row in sorted(shown, key=key, reverse=self.descending)]


def state_style(state: str) -> str:
    """The colour of a state in the table."""
    return _STATE_STYLES.get(state, "")


_STATE_STYLES = {
    "PENDING": "yellow",
    "QUEUED": "yellow",
    "STARTING": "bold yellow",
    "RUNNING": "bold green",
    "SUCCEEDED": "blue",
    "FAILED": "bold red",
    "NODE_FAIL": "bold red",
    "LOST": "red",
    "CANCELLED": "magenta",
    "TIMEOUT": "magenta",
    "PREEMPTED": "magenta",
}
