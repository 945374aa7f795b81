"""The job history in SQL, against SQLite and a real PostgreSQL: schema from the migrations, idempotent insert,
state changes with their events, terminal states that never change, stale observations ignored."""

from __future__ import annotations

from pathlib import Path

import pytest
from clusterx.db.engine import HEAD_REVISION, MIGRATIONS_DIR, current_revision, make_engine, resolve_db_url
from clusterx.db.models import Base, Job, utcnow
from clusterx.states import JobState
from clusterx.store import JobStore


def _job(submit_key: str, **overrides: object) -> Job:
    now = utcnow()
    fields: dict[str, object] = {
        "submit_key": submit_key,
        "name": "job",
        "user": "alice",
        "submit_host": "host",
        "backend": "fake",
        "state": JobState.PENDING.value,
        "spec": {"command": ["true"]},
        "run_dir": "/tmp/run",
        "log_paths": {},
        "hosts": [],
        "rank_to_host": {},
        "attempt": 1,
        "max_retries": 0,
        "priority": 0,
        "nodes": 1,
        "cpus": 1,
        "gpus": 0,
        "mem_mib": 0,
        "cancel_requested": False,
        "created_at": now,
        "updated_at": now,
    }
    fields.update(overrides)
    return Job(**fields)


@pytest.fixture
def store(db_url: str) -> JobStore:
    return JobStore(resolve_db_url(db_url))


def test_schema_comes_from_the_migrations_and_matches_the_models(store: JobStore) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from sqlalchemy import inspect

    assert current_revision(store.engine) == HEAD_REVISION
    assert ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head() == HEAD_REVISION
    assert {"jobs", "job_events", "attempts", "alembic_version"} <= set(inspect(store.engine).get_table_names())
    with store.engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []


def test_sqlite_is_created_on_first_use_in_wal_mode(tmp_path: Path) -> None:
    url = resolve_db_url(str(tmp_path / "new" / "dir" / "jobs.db"))
    store = JobStore(url)
    with store.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    assert (tmp_path / "new" / "dir" / "jobs.db").exists()


def test_default_database_is_in_the_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLUSTERX_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert resolve_db_url(None) == f"sqlite:///{tmp_path}/clusterx/clusterx.db"
    monkeypatch.setenv("CLUSTERX_DB", "postgresql://u@h/db")
    assert resolve_db_url(None) == "postgresql+psycopg://u@h/db"
    assert resolve_db_url(str(tmp_path / "x.db")) == f"sqlite:///{tmp_path}/x.db"  # --db wins


def test_unsupported_url_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not supported"):
        resolve_db_url("mysql://u@h/db")


def test_insert_is_idempotent_by_submit_key(store: JobStore) -> None:
    first, created = store.insert_job(_job("k1"), source="test", message="new")
    again, created_again = store.insert_job(_job("k1", name="other"), source="test", message="new")
    assert created and not created_again
    assert again.id == first.id and again.name == "job"
    assert len(store.list_jobs(limit=None)) == 1
    assert [e.to_state for e in store.events(first.id)] == ["PENDING"]


def test_state_changes_write_events_and_timestamps(store: JobStore) -> None:
    job, _ = store.insert_job(_job("k2"), source="test", message="new")
    assert store.apply(job.id, "test", "queued", JobState.QUEUED)
    assert store.apply(job.id, "test", "running", JobState.RUNNING, fields={"hosts": ["n1"]})
    assert store.apply(job.id, "test", "done", JobState.SUCCEEDED, fields={"exit_code": 0})
    stored = store.get(job.id)
    assert stored.state == "SUCCEEDED" and stored.hosts == ["n1"] and stored.exit_code == 0
    assert stored.started_at is not None and stored.ended_at is not None and stored.ended_at >= stored.started_at
    assert stored.ended_at.tzinfo is not None
    events = store.events(job.id)
    assert [(e.from_state, e.to_state) for e in events] == [
        (None, "PENDING"),
        ("PENDING", "QUEUED"),
        ("QUEUED", "RUNNING"),
        ("RUNNING", "SUCCEEDED"),
    ]


def test_terminal_state_never_changes(store: JobStore) -> None:
    job, _ = store.insert_job(_job("k3"), source="test", message="new")
    store.apply(job.id, "test", "failed", JobState.FAILED, fields={"exit_code": 3})
    assert not store.apply(job.id, "poll", "late", JobState.SUCCEEDED, fields={"exit_code": 0})
    assert not store.apply(job.id, "poll", "late", JobState.RUNNING)
    assert not store.requeue_for_retry(job.id, 1, "x", "retry", {})
    assert store.request_cancel(job.id, "x") == JobState.FAILED
    stored = store.get(job.id)
    assert (stored.state, stored.exit_code) == ("FAILED", 3)
    assert len(store.events(job.id)) == 2


def test_stale_observation_does_not_move_a_job_back(store: JobStore) -> None:
    job, _ = store.insert_job(_job("k4"), source="test", message="new")
    store.apply(job.id, "poll", "running", JobState.RUNNING, fields={"raw_state": "RUNNING"})
    assert not store.apply(job.id, "poll", "stale", JobState.QUEUED, fields={"raw_state": "PENDING"})
    stored = store.get(job.id)
    assert (stored.state, stored.raw_state) == ("RUNNING", "RUNNING")


def test_answer_about_an_old_attempt_is_ignored(store: JobStore) -> None:
    job, _ = store.insert_job(_job("k5", max_retries=1), source="test", message="new")
    store.apply(job.id, "t", "running", JobState.RUNNING)
    assert store.requeue_for_retry(job.id, 1, "t", "attempt 1 failed", {"state": "FAILED", "exit_code": 1})
    assert not store.requeue_for_retry(job.id, 1, "t", "same failure seen twice", {})
    assert not store.apply(job.id, "poll", "old attempt", JobState.FAILED, expect_attempt=1)
    stored = store.get(job.id)
    assert (stored.state, stored.attempt) == ("QUEUED", 2)
    assert [(a.attempt, a.state, a.exit_code) for a in store.attempts(job.id)] == [(1, "FAILED", 1)]


def test_claim_is_exclusive_and_respects_cancel(store: JobStore) -> None:
    a, _ = store.insert_job(_job("k6", backend="local"), source="t", message="new")
    b, _ = store.insert_job(_job("k7", backend="local"), source="t", message="new")
    for job in (a, b):
        store.apply(job.id, "t", "queued", JobState.QUEUED)
    assert store.claim(a.id, "d1") and not store.claim(a.id, "d2")
    assert store.request_cancel(b.id, "user") == JobState.CANCELLED  # a queued local job is cancelled at once
    assert not store.claim(b.id, "d1")


def test_list_filters_and_order(store: JobStore) -> None:
    for i, (name, user, backend) in enumerate(
        [("train-a", "alice", "fake"), ("train-b", "bob", "local"), ("eval", "alice", "local")]
    ):
        store.insert_job(_job(f"l{i}", name=name, user=user, backend=backend), source="t", message="new")
    assert [j.name for j in store.list_jobs()] == ["eval", "train-b", "train-a"]  # newest first
    assert [j.name for j in store.list_jobs(user="alice")] == ["eval", "train-a"]
    assert [j.name for j in store.list_jobs(name="train")] == ["train-b", "train-a"]
    assert [j.name for j in store.list_jobs(name="t*-a")] == ["train-a"]
    assert [j.name for j in store.list_jobs(backend="local", limit=1)] == ["eval"]
    assert store.list_jobs(states=["RUNNING"]) == []


def test_queue_order_is_priority_then_submission(store: JobStore) -> None:
    for key, priority in [("q1", 0), ("q2", 5), ("q3", 0), ("q4", 5)]:
        job, _ = store.insert_job(_job(key, backend="local", priority=priority), source="t", message="new")
        store.apply(job.id, "t", "queued", JobState.QUEUED)
    order = [store.get(q.id).submit_key for q in list(store.queued("local"))]
    assert order == ["q2", "q4", "q1", "q3"]


def test_migrations_are_not_rerun_on_an_up_to_date_database(db_url: str) -> None:
    url = resolve_db_url(db_url)
    JobStore(url)
    engine = make_engine(url)
    assert current_revision(engine) == HEAD_REVISION
    JobStore(url, engine=engine)  # second open: the version check alone
    assert current_revision(engine) == HEAD_REVISION


def test_busy_database_errors_are_retried(tmp_path: Path) -> None:
    """A real 'database is locked' (another connection holds the write lock; this engine does not wait) is
    retried until the lock is gone."""
    import sqlite3

    from clusterx.db.engine import retry_db
    from sqlalchemy import create_engine, text

    path = tmp_path / "busy.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x INTEGER)")
    holder.execute("BEGIN IMMEDIATE")
    impatient = create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
    calls = 0

    def insert() -> int:
        nonlocal calls
        calls += 1
        if calls == 3:
            holder.execute("COMMIT")  # the other writer finishes
        with impatient.begin() as connection:
            connection.execute(text("INSERT INTO t VALUES (1)"))
        return calls

    assert retry_db(insert) == 3
    assert holder.execute("SELECT count(*) FROM t").fetchone() == (1,)


def test_unreachable_database_is_one_clear_error() -> None:
    from clusterx.errors import DatabaseConfigError

    with pytest.raises(DatabaseConfigError, match=r"(?s)cannot open the job database .*\*\*\*.*check --db") as info:
        JobStore(resolve_db_url("postgresql://someone:s3cret@127.0.0.1:1/nothing"))
    assert "s3cret" not in str(info.value)
