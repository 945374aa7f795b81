"""The jobs cache over a real clusterx database: incremental reads see new jobs, state changes and ends."""

from pathlib import Path

import pytest
import xtop.jobs
from clusterx import Client, JobSpec
from clusterx.states import JobState
from sqlalchemy import event
from xtop.jobs import JobDelta, JobFeed, JobQuery, JobRow, JobTableModel

from tests.tui.builders import set_fake_state, submit_fake


def _model(feed: JobFeed) -> JobTableModel:
    model = JobTableModel()
    model.apply(feed.fetch())
    return model


def test_the_feed_reads_everything_once_then_only_what_changed(tmp_path: Path) -> None:
    db, fake = str(tmp_path / "jobs.db"), tmp_path / "fake"
    first = submit_fake(db, fake, "first")
    second = submit_fake(db, fake, "second")
    feed = JobFeed(db)
    model = _model(feed)
    assert [model.rows[i].name for i in model.order] == ["second", "first"]
    set_fake_state(db, fake, first, "RUNNING")
    third = submit_fake(db, fake, "third")
    model.apply(feed.fetch())
    assert model.rows[first].state == "RUNNING"
    assert model.order == [third, second, first]
    set_fake_state(db, fake, second, "SUCCEEDED")  # no longer live: its final record is read
    model.apply(feed.fetch())
    assert model.rows[second].state == "SUCCEEDED"
    assert model.live_count == 2
    feed.close()


def _statements(feed: JobFeed) -> list[str]:
    """Every SQL statement the feed's client sends from now on (SQLAlchemy's cursor events)."""
    seen: list[str] = []
    event.listen(feed.client.store.engine, "before_cursor_execute", lambda *args: seen.append(args[2]))
    return seen


def test_a_refresh_reads_the_changed_jobs_in_one_query_whatever_ended(tmp_path: Path) -> None:
    """A tick is one read of the jobs changed since the newest change seen, however many jobs are stored and
    however many ended since: never a query per job. (Local jobs, which no backend is polled for; the daemon's
    writes are made here through the store, as the daemon makes them.)"""
    db = str(tmp_path / "jobs.db")
    client = Client(db, runs_dir=tmp_path / "runs")
    spec = JobSpec(command=["true"], backend_options={"autostart": "false"})  # queued; no daemon starts
    ids = [client.submit(spec.model_copy(update={"submit_key": f"k{i}"})).id for i in range(12)]
    feed = JobFeed(db)
    model = _model(feed)
    sent = _statements(feed)
    model.apply(feed.fetch())
    quiet = [sql for sql in sent if sql.lstrip().startswith("SELECT")]
    # The live jobs of the polled backends (none here), then the jobs changed.
    assert len(quiet) <= 2 and sum("updated_at >=" in sql for sql in quiet) == 1, sent
    for job_id in ids[:10]:  # ten jobs end between two ticks
        client.store.apply(job_id, "daemon", "done", JobState.SUCCEEDED, fields={"exit_code": 0})
    sent.clear()
    delta = feed.fetch()
    model.apply(delta)
    reads = [sql for sql in sent if sql.lstrip().startswith("SELECT")]
    assert reads == quiet, sent  # the same queries, not one per ended job
    assert {row.id for row in delta.rows} >= set(ids[:10])
    assert [model.rows[i].state for i in ids[:10]] == ["SUCCEEDED"] * 10
    assert model.live_count == 2
    feed.close()
    client.close()


def test_the_full_read_goes_by_ids_a_page_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db, fake = str(tmp_path / "jobs.db"), tmp_path / "fake"
    ids = [submit_fake(db, fake, f"job-{i}") for i in range(7)]
    monkeypatch.setattr("xtop.jobs.FULL_READ_IDS", 3)
    feed = JobFeed(db)
    asked: list[list[int]] = []
    read_many = feed.client.read_many
    monkeypatch.setattr(
        feed.client, "read_many", lambda job_ids, **kw: asked.append(list(job_ids)) or read_many(job_ids, **kw)
    )
    model = _model(feed)
    assert asked == [[5, 6, 7], [2, 3, 4], [1]]
    assert model.order == ids[::-1] and model.loaded
    feed.close()


def test_the_overlap_is_clusterx_own() -> None:
    from clusterx.client import CHANGES_OVERLAP

    assert xtop.jobs.CHANGES_OVERLAP == CHANGES_OVERLAP


def test_the_order_kept_incrementally_equals_a_full_sort() -> None:
    model = JobTableModel()
    model.apply(
        JobDelta(rows=[_row(i, f"n{i % 7}", f"u{i % 3}", "RUNNING" if i % 4 else "FAILED") for i in range(1, 60)])
    )
    for sort_key in ("id", "name", "user", "state"):
        for descending in (True, False):
            model.sort_key, model.descending = sort_key, descending
            model.reorder()
            model.apply(JobDelta(rows=[_row(i, f"m{i % 5}", "zed", "SUCCEEDED") for i in range(3, 70, 4)]))
            kept = list(model.order)
            model.reorder()
            assert kept == model.order, (sort_key, descending)
    model.set_query("state:succ")
    model.apply(JobDelta(rows=[_row(5, "x", "y", "RUNNING"), _row(200, "new", "y", "SUCCEEDED")]))
    kept = list(model.order)
    model.reorder()
    assert kept == model.order and 5 not in kept and 200 in kept


def test_an_unreachable_database_is_a_message_not_an_exception() -> None:
    feed = JobFeed("postgresql+psycopg://nobody@127.0.0.1:9/none?connect_timeout=2")
    delta = feed.fetch()
    assert delta.rows == [] and delta.problem is not None
    assert delta.problem.startswith("job database unreachable:")
    model = JobTableModel()
    model.apply(delta)
    assert model.problem == delta.problem and not model.loaded


def _row(job_id: int, name: str, user: str, state: str) -> JobRow:
    return JobRow(job_id, name, user, state, "local", 1, 0, 1, 1, 0, None, None, None, None, (), None)


def test_the_query_filters_by_words_and_keys_and_names_a_bad_key() -> None:
    model = JobTableModel()
    rows = [_row(1, "moe-a", "alice", "RUNNING"), _row(2, "dense", "bob", "FAILED"), _row(3, "moe-b", "bob", "QUEUED")]
    model.rows = {row.id: row for row in rows}
    model.set_query("moe")
    assert model.order == [3, 1]
    model.set_query("state:run")
    assert model.order == [1]
    model.set_query("user:bob moe")
    assert model.order == [3]
    model.set_query("id:2")
    assert model.order == [2]
    model.set_query("colour:red")
    assert model.query.problem == "unknown filter key 'colour': use id, name, user, state, backend"
    assert model.order == [3, 2, 1]  # a bad query filters nothing
    model.set_query("")
    model.cycle_sort()  # id -> name
    assert (model.sort_key, model.order) == ("name", [3, 1, 2])
    model.flip_order()
    assert model.order == [2, 1, 3]
    assert JobQuery.parse("id:x").problem == "id:x: not a job number"
