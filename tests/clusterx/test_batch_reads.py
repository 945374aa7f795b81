"""Reads of many jobs at once, against SQLite and a real PostgreSQL: by ids (`Client.read_many`) and by change
time (`Client.changed_since`, served by the index ix_jobs_updated_at that migration 0003 adds, also to an existing
database); the records they build straight from rows equal the validated records of `describe`."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from clusterx import Client, JobSpec
from clusterx.backends.fake import write_fake_state
from clusterx.db.engine import HEAD_REVISION, MIGRATIONS_DIR, current_revision, make_engine, resolve_db_url
from clusterx.db.models import Job, utcnow
from clusterx.store import ID_BATCH
from sqlalchemy import insert, inspect


@pytest.fixture
def fake_dir(tmp_path: Path) -> Path:
    return tmp_path / "fake-cluster"


@pytest.fixture
def client(db_url: str, tmp_path: Path) -> Client:
    return Client(db_url, runs_dir=tmp_path / "runs", poll_interval_s=0)


def _spec(fake_dir: Path, **fields: object) -> JobSpec:
    return JobSpec.from_mapping(
        {"command": ["train"], "backend": "fake", "backend_options": {"state_dir": str(fake_dir)}, **fields}
    )


def _bulk(client: Client, count: int, prefix: str = "bulk") -> None:
    """`count` ended jobs written straight into the table (thousands of submits would take minutes)."""
    now = utcnow()
    spec = JobSpec(command=["true"], workdir="/w", run_dir="/r").model_dump(mode="json")
    rows = [
        {
            "submit_key": f"{prefix}-{i}", "name": f"bulk-{i}", "user": "bench", "submit_host": "h",
            "backend": "local", "state": "SUCCEEDED", "spec": spec, "run_dir": "/r", "log_paths": {}, "hosts": [],
            "rank_to_host": {}, "attempt": 1, "max_retries": 0, "priority": 0, "nodes": 1, "cpus": 1, "gpus": 0,
            "mem_mib": 0, "cancel_requested": False, "created_at": now, "updated_at": now,
        }
        for i in range(count)
    ]  # fmt: skip
    with client.store.engine.begin() as connection:
        connection.execute(insert(Job), rows)


def _listed(record_id: int, client: Client) -> dict[str, object]:
    """What `describe` says of a job, without its events and attempts: what a read of many jobs must equal."""
    return client.describe(record_id, poll=False).model_copy(update={"events": None, "attempts": None}).to_dict()


def test_read_many_gives_the_records_of_the_ids_in_id_order(client: Client, fake_dir: Path) -> None:
    first = client.submit(_spec(fake_dir, name="a", nodes=2, procs_per_node=2, env={"A": "1"}, max_retries=1))
    second = client.submit(_spec(fake_dir, name="b", time_limit="5m"))
    write_fake_state(
        fake_dir,
        first.backend_job_id,
        {"state": "FAILED", "raw_state": "OOM", "exit_code": 137, "hosts": ["n1", "n2"], "rank_to_host": {"0": "n1"}},
    )
    client.reconcile(force=True)  # attempt 1 failed, retried: attempt 2, hosts, exit code, reason recorded
    records = client.read_many([second.id, 10**6, first.id], poll=False)
    assert [r.id for r in records] == [first.id, second.id]  # id order; an id with no job left out
    assert [r.to_dict() for r in records] == [_listed(first.id, client), _listed(second.id, client)]
    assert records[0] == client.list(name="a", poll=False)[0]
    assert records[0].spec == JobSpec.model_validate(records[0].spec.model_dump())  # a real JobSpec
    assert records[0].attempt == 2 and records[1].spec.time_limit == 300
    assert records[0].events is None and records[0].attempts is None
    assert client.read_many([], poll=False) == []


def test_read_many_reads_more_ids_than_one_statement_takes(client: Client) -> None:
    _bulk(client, 2 * ID_BATCH + 7)
    ids = [r.id for r in client.list(limit=None, poll=False)]
    records = client.read_many(ids + ids[:10], poll=False)  # repeated ids once
    assert [r.id for r in records] == sorted(ids)


def test_changed_since_reads_new_and_changed_jobs_only(client: Client, fake_dir: Path) -> None:
    before = utcnow()
    a = client.submit(_spec(fake_dir, name="a"))
    b = client.submit(_spec(fake_dir, name="b"))
    assert [r.id for r in client.changed_since(before, poll=False)] == [a.id, b.id]  # oldest change first
    client.reconcile(force=True)  # the backend's first answer (its own word for queued) is a change too
    after_submits = utcnow()
    assert client.changed_since(after_submits) == []  # a poll that finds nothing new changes nothing
    write_fake_state(fake_dir, b.backend_job_id, {"state": "RUNNING", "raw_state": "R", "hosts": ["n1"]})
    changed = client.changed_since(after_submits)  # polls the backend first: b's change is recorded, then read
    assert [(r.id, r.state, r.hosts) for r in changed] == [(b.id, "RUNNING", ["n1"])]
    assert changed[0].to_dict() == _listed(b.id, client)
    c = client.submit(_spec(fake_dir, name="c"))
    client.cancel([a.id])
    since = changed[0].updated_at + timedelta(microseconds=1)
    assert {r.id for r in client.changed_since(since, poll=False)} == {a.id, c.id}
    assert client.changed_since(changed[0].updated_at, poll=False)[0].id == b.id  # at `since` counts


def test_changed_since_is_served_by_the_updated_at_index(client: Client) -> None:
    _bulk(client, 50)
    engine = client.store.engine
    assert "ix_jobs_updated_at" in {index["name"] for index in inspect(engine).get_indexes("jobs")}
    if engine.dialect.name == "sqlite":
        with engine.connect() as connection:
            plan = connection.exec_driver_sql(
                "EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE updated_at >= ? ORDER BY updated_at, id", ("2026",)
            ).fetchall()
        assert any("ix_jobs_updated_at" in str(row) for row in plan), plan


def test_an_existing_database_gets_the_index_and_keeps_its_jobs(db_url: str, tmp_path: Path) -> None:
    url = resolve_db_url(db_url)
    engine = make_engine(url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:  # a database as the release before this index left it
        config.attributes["connection"] = connection
        command.upgrade(config, "0002")
    assert current_revision(engine) == "0002"
    with engine.begin() as connection:
        connection.execute(
            insert(Job),
            [{"submit_key": "old", "name": "old", "user": "u", "submit_host": "h", "backend": "local",
              "state": "SUCCEEDED", "spec": JobSpec(command=["true"]).model_dump(mode="json"), "run_dir": "/r",
              "log_paths": {}, "hosts": [], "rank_to_host": {}, "attempt": 1, "max_retries": 0, "priority": 0,
              "nodes": 1, "cpus": 1, "gpus": 0, "mem_mib": 0, "cancel_requested": False,
              "created_at": utcnow(), "updated_at": utcnow()}],
        )  # fmt: skip
    engine.dispose()
    client = Client(db_url, runs_dir=tmp_path / "runs")  # opening it upgrades it
    assert current_revision(client.store.engine) == HEAD_REVISION
    assert "ix_jobs_updated_at" in {index["name"] for index in inspect(client.store.engine).get_indexes("jobs")}
    assert [r.name for r in client.changed_since(utcnow() - timedelta(hours=1), poll=False)] == ["old"]
    client.close()


def test_a_glance_agrees_with_the_records_and_loads_no_sqlalchemy(sqlite_db: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    from clusterx.glance import JobGlance, newest_jobs

    client = Client(sqlite_db, runs_dir=tmp_path / "runs", poll_interval_s=0)
    fake_dir = tmp_path / "fake"
    first = client.submit(_spec(fake_dir, name="a", nodes=2, procs_per_node=4, gpus_per_node=4))
    client.submit(_spec(fake_dir, name="b"))
    write_fake_state(fake_dir, first.backend_job_id, {"state": "RUNNING", "raw_state": "R", "hosts": ["n1", "n2"]})
    client.reconcile(force=True)
    glances = newest_jobs(sqlite_db, 10)
    assert glances is not None
    records = client.list(poll=False)
    assert [g.id for g in glances] == [r.id for r in records]  # newest first
    for glance, record in zip(glances, records, strict=True):
        expected = {name: getattr(record, name) for name in JobGlance.__dataclass_fields__ if hasattr(record, name)}
        expected.update(
            nodes=record.spec.nodes,
            gpus_per_node=record.spec.gpus_per_node,
            procs_per_node=record.spec.procs_per_node,
            hosts=tuple(record.hosts),
        )
        assert glance == JobGlance(**expected)
    assert newest_jobs(sqlite_db, 1) == glances[:1]
    assert newest_jobs(str(tmp_path / "none.db"), 5) == []  # no file yet: no jobs (and no file made)
    assert not (tmp_path / "none.db").exists()
    assert newest_jobs("postgresql://nobody@127.0.0.1:9/x", 5) is None  # not a file: the client reads it
    probe = "import sys, clusterx.glance; print('sqlalchemy' in sys.modules, 'pydantic' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.split() == ["False", "False"]
