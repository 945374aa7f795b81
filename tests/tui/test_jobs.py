"""The jobs cache over a real clusterx database: incremental reads see new jobs, state changes and ends."""

from pathlib import Path

from xtop.jobs import JobFeed, JobQuery, JobRow, JobTableModel

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
    assert feed.fetch().rows and all(row.live for row in feed.fetch().rows)  # only live jobs are read again
    set_fake_state(db, fake, first, "RUNNING")
    third = submit_fake(db, fake, "third")
    model.apply(feed.fetch())
    assert model.rows[first].state == "RUNNING"
    assert model.order == [third, second, first]
    set_fake_state(db, fake, second, "SUCCEEDED")  # no longer live: its final record is read once
    model.apply(feed.fetch())
    assert model.rows[second].state == "SUCCEEDED"
    assert second not in {row.id for row in feed.fetch().rows}
    feed.close()


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
