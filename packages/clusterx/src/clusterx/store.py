"""All reads and writes of the job history. Every change of state goes through `JobStore.apply`, which locks the
job's row, refuses to move a terminal job or to move a live one backwards (`may_transition`), and writes a
job_events row for the change in the same transaction.

The one sanctioned backward move is `requeue_for_retry`: a failed attempt with retries left puts the job back to
QUEUED with the next attempt number (the job stays live between attempts; only the last attempt's end is final).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import Engine, Select, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from clusterx.backends.registry import backend_info
from clusterx.db.engine import ensure_schema, make_engine, retry_db
from clusterx.db.models import Attempt, Job, JobEvent, utcnow
from clusterx.db.record import RECORD_COLUMNS, records_from_rows
from clusterx.errors import DatabaseConfigError, JobNotFoundError
from clusterx.record import JobRecord
from clusterx.states import JobState, may_transition

T = TypeVar("T")
# Rows of the queue read at a time: a pass that stops after a few jobs reads one batch.
QUEUE_BATCH = 256
# Ids per statement of a read by ids: under SQLite's and PostgreSQL's limits on bound parameters.
ID_BATCH = 500


@dataclass(frozen=True)
class Capacity:
    """Resources of one machine (or what is left of them)."""

    cpus: int
    mem_mib: int
    gpus: int

    def fits(self, cpus: int, mem_mib: int, gpus: int) -> bool:
        return cpus <= self.cpus and mem_mib <= self.mem_mib and gpus <= self.gpus

    def minus(self, cpus: int, mem_mib: int, gpus: int) -> Capacity:
        return Capacity(self.cpus - cpus, self.mem_mib - mem_mib, self.gpus - gpus)


class QueuedJob(NamedTuple):
    """What a scheduling pass needs of one queued job (plain columns, no JSON). A named tuple: a pass reads
    thousands, and a tuple costs a fraction of a dataclass."""

    id: int
    priority: int
    cpus: int
    gpus: int
    mem_mib: int
    time_limit_s: int | None


class JobStore:
    def __init__(self, url: str, engine: Engine | None = None) -> None:
        self.url = url
        # For messages: a PostgreSQL URL may carry a password.
        self.shown_url = make_url(url).render_as_string(hide_password=True)
        self.engine = engine or make_engine(url)
        self._queue_statements: dict[tuple[str, str | None], tuple[str, Any]] = {}
        try:
            ensure_schema(self.engine)
        except DBAPIError as exc:
            raise DatabaseConfigError(
                f"cannot open the job database {self.shown_url}: {exc.orig}; check --db / CLUSTERX_DB"
            ) from None

    def close(self) -> None:
        self.engine.dispose()

    # -- transactions -------------------------------------------------------------------------------------------
    def write(self, fn: Callable[[Session], T]) -> T:
        """Run `fn` in one write transaction (BEGIN IMMEDIATE on SQLite), retried when the database is busy."""

        def once() -> T:
            with Session(self.engine, expire_on_commit=False) as session:
                session.connection(execution_options={"clusterx_write": True})
                result = fn(session)
                session.commit()
                return result

        return retry_db(once)

    def read(self, fn: Callable[[Session], T]) -> T:
        def once() -> T:
            with Session(self.engine, expire_on_commit=False) as session:
                return fn(session)

        return retry_db(once)

    # -- creating -----------------------------------------------------------------------------------------------
    def insert_job(self, job: Job, source: str, message: str) -> tuple[Job, bool]:
        """Store a new job (and its first event); returns (job, created). A job with the same submit key
        already stored is returned as it is: a repeated submit is idempotent."""

        def insert(session: Session) -> Job:
            session.add(job)
            session.flush()
            session.add(_event(job.id, job.attempt, None, job.state, source=source, message=message))
            return job

        try:
            return self.write(insert), True
        except IntegrityError:
            existing = self.read(
                lambda s: s.execute(select(Job).where(Job.submit_key == job.submit_key)).scalar_one_or_none()
            )
            if existing is None:
                raise
            return existing, False

    # -- reading ------------------------------------------------------------------------------------------------
    def get(self, job_id: int) -> Job:
        job = self.read(lambda s: s.get(Job, job_id))
        if job is None:
            raise JobNotFoundError(f"no job {job_id} in {self.shown_url}; `clusterx list` shows the jobs there")
        return job

    def list_jobs(
        self,
        *,
        states: Iterable[str] = (),
        user: str | None = None,
        name: str | None = None,
        backend: str | None = None,
        limit: int | None = 50,
        live_only: bool = False,
    ) -> list[Job]:
        """Newest first. `name` matches a substring ('*' and '?' work as wildcards)."""
        query = _filtered(
            select(Job), states=states, user=user, name=name, backend=backend, limit=limit, live_only=live_only
        )
        return self.read(lambda s: list(s.execute(query).scalars()))

    def list_records(
        self,
        *,
        states: Iterable[str] = (),
        user: str | None = None,
        name: str | None = None,
        backend: str | None = None,
        limit: int | None = 50,
    ) -> list[JobRecord]:
        """`list_jobs`' jobs as records, built straight from the rows (clusterx.db.record.records_from_rows)."""
        query = _filtered(
            select(*RECORD_COLUMNS), states=states, user=user, name=name, backend=backend, limit=limit, live_only=False
        )
        return self._records(query)

    def records_by_ids(self, job_ids: Iterable[int]) -> list[JobRecord]:
        """The records of these jobs, in id order; an id with no job is left out. One query per
        ID_BATCH ids (the databases bound how many parameters one statement takes)."""
        ids = sorted(set(job_ids))
        records: list[JobRecord] = []
        for start in range(0, len(ids), ID_BATCH):
            batch = ids[start : start + ID_BATCH]
            records += self._records(select(*RECORD_COLUMNS).where(Job.id.in_(batch)).order_by(Job.id))
        return records

    def records_changed_since(self, since: datetime) -> list[JobRecord]:
        """The records of jobs whose `updated_at` is at or after `since` (every change of a job row sets it;
        new jobs included), oldest change first. The index ix_jobs_updated_at serves it, so its cost is the jobs
        changed, not the jobs stored."""
        query = select(*RECORD_COLUMNS).where(Job.updated_at >= since).order_by(Job.updated_at, Job.id)
        return self._records(query)

    def _records(self, query: Select[Any]) -> list[JobRecord]:
        def once() -> list[JobRecord]:
            with self.engine.connect() as connection:
                return records_from_rows(connection.execute(query))

        return retry_db(once)

    def events(self, job_id: int) -> list[JobEvent]:
        query = select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
        return self.read(lambda s: list(s.execute(query).scalars()))

    def attempts(self, job_id: int) -> list[Attempt]:
        query = select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.attempt)
        return self.read(lambda s: list(s.execute(query).scalars()))

    def attempt(self, job_id: int, attempt: int) -> Attempt | None:
        query = select(Attempt).where(Attempt.job_id == job_id, Attempt.attempt == attempt)
        return self.read(lambda s: s.execute(query).scalar_one_or_none())

    def queued(self, backend: str, host: str | None = None) -> Generator[QueuedJob, None, None]:
        """Queued jobs in scheduling order (highest priority first, then submission order), read in batches as
        they are consumed, so that a pass that stops early reads little. The index ix_jobs_queue_order serves
        this query in its order, and holds every column it reads.

        The rows come through the driver's own cursor, not SQLAlchemy's result objects: every column is a plain
        integer, and on a 10,000-job queue SQLAlchemy's row handling cost about a third of the whole pass."""
        sql, params = self._queue_statement(backend, host)
        with self.engine.connect() as connection:
            cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]  # a live connection
            try:
                cursor.execute(sql, params)
                while batch := cursor.fetchmany(QUEUE_BATCH):
                    yield from map(QueuedJob._make, batch)
            finally:
                cursor.close()

    def _queue_statement(self, backend: str, host: str | None) -> tuple[str, Any]:
        """`queued`'s SQL in the driver's own parameter style, with its parameters; compiled once per queue."""
        key = (backend, host)
        if key not in self._queue_statements:
            query = (
                select(Job.id, Job.priority, Job.cpus, Job.gpus, Job.mem_mib, Job.time_limit_s)
                .where(Job.state == JobState.QUEUED.value, Job.backend == backend, Job.cancel_requested.is_(False))
                .order_by(Job.priority.desc(), Job.id)
            )
            if host is not None:
                query = query.where(Job.submit_host == host)
            compiled = query.compile(dialect=self.engine.dialect)
            names = compiled.positiontup
            params = dict(compiled.params) if names is None else tuple(compiled.params[name] for name in names)
            self._queue_statements[key] = (str(compiled), params)
        return self._queue_statements[key]

    # -- changing -----------------------------------------------------------------------------------------------
    def apply(
        self,
        job_id: int,
        source: str,
        message: str,
        state: JobState | None = None,
        *,
        fields: Mapping[str, Any] | None = None,
        expect_attempt: int | None = None,
        expect_state: JobState | None = None,
        attempt_fields: Mapping[str, Any] | None = None,
    ) -> bool:
        """Move a job to `state` (if allowed) and set `fields`; returns True when the state changed.

        Nothing changes when the job is terminal, when it is on another attempt than `expect_attempt`, when it
        is not in `expect_state`, or when `state` would move it backwards (a stale observation).
        `attempt_fields` update the current attempt's row along with the job.
        """

        def change(session: Session) -> bool:
            job = session.get(Job, job_id, with_for_update=True)
            if job is None:
                raise JobNotFoundError(f"no job {job_id} in {self.shown_url}")
            current = job.state
            if current.is_terminal:
                return False
            if expect_attempt is not None and job.attempt != expect_attempt:
                return False
            if expect_state is not None and current != expect_state:
                return False
            changed = changed_row = False
            now = utcnow()
            if state is not None and state != current:
                if not may_transition(current, state):
                    return False
                job.state = state
                changed = True
                session.add(_event(job.id, job.attempt, current, state, source=source, message=message))
                if state in (JobState.RUNNING, JobState.STARTING) and job.started_at is None:
                    job.started_at = now
                if state.is_terminal and job.ended_at is None:
                    job.ended_at = now
            for key, value in (fields or {}).items():
                if getattr(job, key) != value:
                    setattr(job, key, value)
                    changed_row = True
            # updated_at says when the record last changed (readers of the changed jobs rely on it): a poll that
            # found nothing new leaves it, and the row, as they were.
            if changed or changed_row:
                job.updated_at = now
            if attempt_fields:
                _upsert_attempt(session, job, attempt_fields)
            return changed

        return self.write(change)

    def note(self, job_id: int, source: str, message: str) -> None:
        """An event that is not a state change (e.g. a restarted daemon adopting a running job)."""

        def add(session: Session) -> None:
            job = session.get(Job, job_id)
            if job is None:
                raise JobNotFoundError(f"no job {job_id} in {self.shown_url}")
            session.add(_event(job.id, job.attempt, job.state, job.state, source=source, message=message))

        self.write(add)

    def set_priority(self, job_id: int, priority: int, source: str) -> None:
        """A live job's new priority (the column the daemon orders its queue by), with an event saying so."""

        def change(session: Session) -> None:
            job = session.get(Job, job_id, with_for_update=True)
            if job is None:
                raise JobNotFoundError(f"no job {job_id} in {self.shown_url}")
            if job.state.is_terminal:
                return
            message = f"priority {job.priority} -> {priority}"
            job.priority = priority
            job.updated_at = utcnow()
            session.add(_event(job.id, job.attempt, job.state, job.state, source=source, message=message))

        self.write(change)

    def requeue_for_retry(
        self, job_id: int, expect_attempt: int, source: str, message: str, attempt_fields: Mapping[str, Any]
    ) -> bool:
        """A failed attempt with retries left: close its attempt row and queue the next attempt."""

        def change(session: Session) -> bool:
            job = session.get(Job, job_id, with_for_update=True)
            if job is None or job.state.is_terminal or job.attempt != expect_attempt:
                return False
            _upsert_attempt(session, job, attempt_fields)
            session.add(_event(job.id, job.attempt + 1, job.state, JobState.QUEUED, source=source, message=message))
            job.state = JobState.QUEUED
            job.attempt += 1
            job.started_at = None
            job.exit_code = None
            job.updated_at = utcnow()
            return True

        return self.write(change)

    def record_attempt(self, job_id: int, fields: Mapping[str, Any]) -> None:
        """Create or update the current attempt's row."""

        def change(session: Session) -> None:
            job = session.get(Job, job_id)
            if job is None:
                raise JobNotFoundError(f"no job {job_id} in {self.shown_url}")
            _upsert_attempt(session, job, fields)

        self.write(change)

    def claim(self, job_id: int, source: str) -> bool:
        """QUEUED → STARTING, unless someone else claimed or cancelled it first."""

        def change(session: Session) -> bool:
            result = session.execute(
                update(Job)
                .where(Job.id == job_id, Job.state == JobState.QUEUED, Job.cancel_requested.is_(False))
                .values(state=JobState.STARTING, updated_at=utcnow())
            )
            if result.rowcount != 1:  # type: ignore[attr-defined]  # CursorResult of an UPDATE has rowcount
                return False
            attempt = session.execute(select(Job.attempt).where(Job.id == job_id)).scalar_one()
            session.add(
                _event(
                    job_id,
                    attempt,
                    JobState.QUEUED,
                    JobState.STARTING,
                    source=source,
                    message="resources granted",
                )
            )
            return True

        return self.write(change)

    def request_cancel(self, job_id: int, source: str) -> JobState:
        """Mark a job for cancellation; a job no backend runs yet (PENDING, local QUEUED) ends CANCELLED at once.
        Returns the job's state afterwards."""

        def change(session: Session) -> JobState:
            job = session.get(Job, job_id, with_for_update=True)
            if job is None:
                raise JobNotFoundError(f"no job {job_id} in {self.shown_url}")
            current = job.state
            if current.is_terminal:
                return current
            job.cancel_requested = True
            job.updated_at = utcnow()
            # A daemon backend's queue is this database: its queued job has not been handed to anyone yet.
            queued_here = current == JobState.QUEUED and backend_info(job.backend).needs_daemon
            not_started = current == JobState.PENDING or queued_here
            if not_started:
                job.state = JobState.CANCELLED
                job.ended_at = job.updated_at
                job.raw_state = "CANCELLED"
                session.add(
                    _event(job.id, job.attempt, current, job.state, source=source, message="cancelled before it ran")
                )
                return JobState.CANCELLED
            return current

        return self.write(change)

    def claim_handoff(self, job_id: int, observed_updated_at: datetime) -> bool:
        """Take over handing a PENDING job to its backend (its submitter died before doing it). Only the one
        caller that still sees the job as it observed it wins."""

        def change(session: Session) -> bool:
            result = session.execute(
                update(Job)
                .where(
                    Job.id == job_id,
                    Job.state == JobState.PENDING,
                    Job.backend_job_id.is_(None),
                    Job.updated_at == observed_updated_at,
                )
                .values(updated_at=utcnow())
            )
            return bool(result.rowcount == 1)  # type: ignore[attr-defined]  # CursorResult of an UPDATE

        return self.write(change)

    def cancel_requested_among(self, job_ids: Sequence[int]) -> list[int]:
        query = select(Job.id).where(Job.id.in_(list(job_ids)), Job.cancel_requested.is_(True))
        with self.engine.connect() as connection:
            return [row[0] for row in connection.execute(query)]

    def unclaim(self, job_id: int, source: str, message: str) -> bool:
        """STARTING → QUEUED for a job whose process never started (its daemon died in between)."""

        def change(session: Session) -> bool:
            result = session.execute(
                update(Job)
                .where(Job.id == job_id, Job.state == JobState.STARTING)
                .values(state=JobState.QUEUED, updated_at=utcnow())
            )
            if result.rowcount != 1:  # type: ignore[attr-defined]  # CursorResult of an UPDATE has rowcount
                return False
            attempt = session.execute(select(Job.attempt).where(Job.id == job_id)).scalar_one()
            session.add(_event(job_id, attempt, JobState.STARTING, JobState.QUEUED, source=source, message=message))
            return True

        return self.write(change)

    def live_jobs(self, backends: Sequence[str]) -> list[Job]:
        query = select(Job).where(
            Job.backend.in_(list(backends)), Job.state.in_([s for s in JobState if not s.is_terminal])
        )
        return self.read(lambda s: list(s.execute(query).scalars()))


def _filtered(
    query: Select[Any],
    *,
    states: Iterable[str],
    user: str | None,
    name: str | None,
    backend: str | None,
    limit: int | None,
    live_only: bool,
) -> Select[Any]:
    """The list's filters and order (newest first) on a select of jobs or of their columns."""
    query = query.order_by(Job.id.desc())
    states = list(states)
    if live_only:
        states = [s for s in JobState if not s.is_terminal]
    if states:
        query = query.where(Job.state.in_(states))
    if user:
        query = query.where(Job.user == user)
    if backend:
        query = query.where(Job.backend == backend)
    if name:
        pattern = name.replace("*", "%").replace("?", "_")
        query = query.where(Job.name.like(pattern if ("*" in name or "?" in name) else f"%{pattern}%"))
    if limit is not None:
        query = query.limit(limit)
    return query


def _event(
    job_id: int, attempt: int, from_state: JobState | None, to_state: JobState, *, source: str, message: str
) -> JobEvent:
    return JobEvent(
        job_id=job_id,
        at=utcnow(),
        attempt=attempt,
        from_state=from_state,
        to_state=to_state,
        source=source,
        message=message,
    )


def _upsert_attempt(session: Session, job: Job, fields: Mapping[str, Any]) -> None:
    row = session.execute(
        select(Attempt).where(Attempt.job_id == job.id, Attempt.attempt == job.attempt)
    ).scalar_one_or_none()
    if row is None:
        row = Attempt(job_id=job.id, attempt=job.attempt, state=fields.get("state", job.state))
        session.add(row)
    for key, value in fields.items():
        setattr(row, key, value)
