"""clusterx's jobs as the dashboard holds them: a cache kept current by incremental reads, a typed query, sorting.

Reading every job each tick does not scale, so the cache reads everything once (by ids, a page of ids at a time)
and then, each tick, only the jobs created or changed since the newest change it has seen
(`clusterx.Client.changed_since`, one indexed query whatever the number of jobs stored or ended). That rests on
clusterx setting a job's `updated_at` at every change of its record. Before all that, the first paint shows the
newest jobs read with the standard library alone (`clusterx.glance`, SQLite files), so the table has its rows in
the first frame without waiting for SQLAlchemy and pydantic to load.

`JobFeed.fetch` runs in a worker thread and returns a `JobDelta`; `JobTableModel.apply` runs on the UI thread, so
the rows the screen draws are never changed under it. The model keeps its order incrementally (a changed job is
moved by bisection), so a tick costs the jobs that changed, not the jobs held.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from clusterx.states import LIVE_STATES

if TYPE_CHECKING:  # loaded with the client, after the first paint (see JobFeed._connect)
    from clusterx import Client
    from clusterx.glance import JobGlance
    from clusterx.record import JobRecord

# Ids per read of the first full load: the records of one page exist at a time, whatever the number of jobs.
FULL_READ_IDS = 5000
# How far before the newest change seen each tick reads again: clusterx.client.CHANGES_OVERLAP (not imported
# from there, which would load SQLAlchemy before the first paint; a test keeps the two equal).
CHANGES_OVERLAP = timedelta(seconds=5)


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
    def from_glance(cls, job: JobGlance) -> JobRow:
        return cls(
            id=job.id,
            name=job.name,
            user=job.user,
            state=job.state.value,
            backend=job.backend,
            nodes=job.nodes,
            gpus_per_node=job.gpus_per_node,
            procs_per_node=job.procs_per_node,
            attempt=job.attempt,
            max_retries=job.max_retries,
            created_at=job.created_at,
            started_at=job.started_at,
            ended_at=job.ended_at,
            run_dir=job.run_dir,
            hosts=job.hosts,
            failure_reason=job.failure_reason,
        )

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
        self._newest_change: datetime | None = None  # the newest updated_at seen (or when the full read began)

    def _connect(self) -> Client:
        if self._client is None:
            if self._client_factory is not None:
                self._client = self._client_factory(self.db)
            else:
                from clusterx import Client  # noqa: PLC0415 (lazy: SQLAlchemy loads after the first paint)

                # xtop's tick sets the pace: polled backends (Slurm) are asked once per tick.
                self._client = Client(self.db, poll_interval_s=0.0)
        return self._client

    def glance(self, limit: int) -> JobDelta | None:
        """The newest jobs read without the client (clusterx.glance), for the first paint; None where the
        database cannot be read that way (not a SQLite file, or not readable now)."""
        from clusterx.glance import newest_jobs  # noqa: PLC0415 (standard library only)

        jobs = newest_jobs(self.db, limit)
        return None if jobs is None else JobDelta(rows=[JobRow.from_glance(job) for job in jobs], complete=False)

    def first_page(self, limit: int = 200) -> JobDelta:
        """The newest jobs through the client, for a first screen where `glance` cannot read; `fetch` reads the
        rest."""
        return self._guarded(lambda client: _rows(client.list(limit=limit, poll=False)), complete=False)

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
            return self._read_all(client)
        assert self._newest_change is not None  # set by the full read
        records = client.changed_since(self._newest_change - CHANGES_OVERLAP, poll=True)
        self._newest_change = max([self._newest_change, *(record.updated_at for record in records)])
        return _rows(records)

    def _read_all(self, client: Client) -> list[JobRow]:
        """Every job, newest first, FULL_READ_IDS ids at a time; later ticks read what changed since it began."""
        began = datetime.now(UTC)
        client.reconcile()
        newest = client.list(limit=1, poll=False)
        rows: list[JobRow] = []
        for high in range(newest[0].id if newest else 0, 0, -FULL_READ_IDS):
            ids = range(max(1, high - FULL_READ_IDS + 1), high + 1)
            rows += reversed(_rows(client.read_many(ids, poll=False)))
        self._newest_change = began
        self._loaded = True
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


def _rows(records: Iterable[JobRecord]) -> list[JobRow]:
    return [JobRow.from_record(record) for record in records]


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


# Above this many changed jobs in one look, sorting everything again is cheaper than moving each one.
REORDER_ABOVE = 2000


class JobTableModel:
    """Every job seen, and the ids the table shows: filtered by the query, sorted by the chosen key.

    `order` (the ids shown, in display order) and `_keys` (their sort keys, in the same order) are kept sorted
    incrementally: a job that changed leaves its old place and is put in its new one by bisection. Only the
    "run time" key moves with the clock, so it sorts everything again each time."""

    def __init__(self) -> None:
        self.rows: dict[int, JobRow] = {}
        self.query = JobQuery()
        self.sort_key = "id"
        self.descending = True
        self.order: list[int] = []
        self._keys: list[Any] = []
        self.problem: str | None = None
        self.warnings: list[str] = []
        self.loaded = False
        self.live_count = 0

    def apply(self, delta: JobDelta) -> bool:
        """Take in one look's result; True when what the table shows may have changed."""
        self.problem = delta.problem
        self.warnings = delta.warnings
        self.loaded = self.loaded or (delta.complete and delta.problem is None)
        changes = [(self.rows.get(row.id), row) for row in delta.rows if self.rows.get(row.id) != row]
        if not changes:
            return False
        for old, row in changes:
            self.rows[row.id] = row
            self.live_count += row.live - (old is not None and old.live)
        if len(changes) > REORDER_ABOVE or self.sort_key == "run time":
            self.reorder()
        else:
            for old, row in changes:
                self._move(old, row)
        return True

    def _move(self, old: JobRow | None, new: JobRow) -> None:
        key = SORT_KEYS[self.sort_key]
        if old is not None and self.query.matches(old):
            at = self._position(key(old))
            if at < len(self.order) and self.order[at] == old.id:
                del self.order[at], self._keys[at]
        if self.query.matches(new):
            new_key = key(new)
            at = self._position(new_key)
            self.order.insert(at, new.id)
            self._keys.insert(at, new_key)

    def _position(self, key: Any) -> int:
        """Where a job of this sort key stands in the display order (keys are unique: each ends with the id)."""
        if self.descending:
            return bisect.bisect_left(self._keys, _Descending(key), key=_Descending)
        return bisect.bisect_left(self._keys, key)

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
            self._keys = list(self.order)
            return
        shown = self.rows.values() if not query.terms else [row for row in self.rows.values() if query.matches(row)]
        key = SORT_KEYS[self.sort_key]
        keyed = sorted(((key(row), row.id) for row in shown), reverse=self.descending)
        self._keys = [k for k, _ in keyed]
        self.order = [job_id for _, job_id in keyed]


class _Descending:
    """A sort key compared the other way round: bisection in a list sorted in descending order."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __lt__(self, other: _Descending) -> bool:
        return bool(other.key < self.key)


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
