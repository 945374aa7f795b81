"""SQLAlchemy models of the job history: jobs, job_events (every state change) and attempts (every run).

The schema is created and changed only by the Alembic migrations in `clusterx/db/migrations`; a test checks
that these models and the migrations agree.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Index, Integer, String, Text, TypeDecorator, UniqueConstraint
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from clusterx.states import JobState


class UTCDateTime(TypeDecorator[datetime]):
    """Timestamps stored in UTC and read back timezone-aware (SQLite forgets the zone otherwise)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        # SQLite stores the text as given; a naive UTC value keeps its ordering and comparison correct.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class JobStateType(TypeDecorator[JobState]):
    """A job state column: JobState in Python, its name (VARCHAR(16)) in the database. A value that is not a
    state fails on the way in and on the way out, so no code converts state strings by hand."""

    impl = String(16)
    cache_ok = True

    def process_bind_param(self, value: JobState | str | None, dialect: Dialect) -> str | None:
        return None if value is None else JobState(value).value

    def process_result_value(self, value: str | None, dialect: Dialect) -> JobState | None:
        return None if value is None else JobState(value)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class Job(Base):
    """One job: the record of Contract 2 (docs/clusterx.md lists every field)."""

    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    submit_key: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    user: Mapped[str] = mapped_column(String(64), index=True)
    submit_host: Mapped[str] = mapped_column(String(255))
    backend: Mapped[str] = mapped_column(String(16))
    backend_job_id: Mapped[str | None] = mapped_column(String(64))
    state: Mapped[JobState] = mapped_column(JobStateType)
    raw_state: Mapped[str | None] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    rendered_request: Mapped[str | None] = mapped_column(Text)
    run_dir: Mapped[str] = mapped_column(Text)
    log_paths: Mapped[dict[str, str]] = mapped_column(JSON)
    hosts: Mapped[list[str]] = mapped_column(JSON)
    rank_to_host: Mapped[dict[str, str]] = mapped_column(JSON)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    failure_reason: Mapped[str | None] = mapped_column(Text)
    attempt: Mapped[int] = mapped_column(Integer)
    max_retries: Mapped[int] = mapped_column(Integer)
    priority: Mapped[int] = mapped_column(Integer)
    # Resources copied out of the spec so that a scheduling pass reads plain columns, not JSON.
    nodes: Mapped[int] = mapped_column(Integer)
    cpus: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[int] = mapped_column(Integer)
    mem_mib: Mapped[int] = mapped_column(Integer)
    time_limit_s: Mapped[int | None] = mapped_column(Integer)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    retry_of: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    submitted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


# The scheduling pass (JobStore.queued): queued jobs of one backend and host, highest priority first, then oldest.
# In the query's own order (no sort per pass) and holding every column the pass reads (no table lookups).
Index(
    "ix_jobs_queue_order",
    Job.state,
    Job.backend,
    Job.submit_host,
    Job.priority.desc(),
    Job.id,
    Job.cancel_requested,
    Job.cpus,
    Job.gpus,
    Job.mem_mib,
    Job.time_limit_s,
)

# Reads of the jobs changed since a time (JobStore.records_changed_since, xtop's refresh): the jobs changed, not
# the jobs stored.
Index("ix_jobs_updated_at", Job.updated_at)


class JobEvent(Base):
    """One state change of a job (or a note such as a retry), with its time, source and message."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    attempt: Mapped[int] = mapped_column(Integer)
    from_state: Mapped[JobState | None] = mapped_column(JobStateType)
    to_state: Mapped[JobState] = mapped_column(JobStateType)
    source: Mapped[str] = mapped_column(String(32))  # client, daemon, poll:<backend>, cli
    message: Mapped[str] = mapped_column(Text)


class Attempt(Base):
    """One run of a job. The local daemon records pid, process group and process start time so that after
    its own restart it adopts only the very process it started."""

    __tablename__ = "attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"))
    attempt: Mapped[int] = mapped_column(Integer)
    backend_job_id: Mapped[str | None] = mapped_column(String(64))
    state: Mapped[JobState] = mapped_column(JobStateType)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(Text)
    host: Mapped[str | None] = mapped_column(String(255))
    pid: Mapped[int | None] = mapped_column(Integer)
    pgid: Mapped[int | None] = mapped_column(Integer)
    proc_start_time: Mapped[float | None] = mapped_column(Float)
    gpu_ids: Mapped[str | None] = mapped_column(String(255))
    log_dir: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (UniqueConstraint("job_id", "attempt", name="uq_attempts_job_attempt"),)
