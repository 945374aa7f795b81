"""The backend registry is the one home of backend facts: the command line's choices, the spec's validation, the
client's polling and the store's cancel rule all follow it; and the typed state column keeps states typed."""

from __future__ import annotations

from pathlib import Path

import pytest
from clusterx import Client, JobSpec
from clusterx.backends import BACKENDS, backend_info, daemon_backends, get_backend, pollable_backends
from clusterx.cli import submit
from clusterx.db.models import Job
from clusterx.errors import SpecError
from clusterx.states import JobState
from sqlalchemy import select, text


def test_every_registered_backend_is_built_by_name_and_names_itself() -> None:
    for name, info in BACKENDS.items():
        backend = get_backend(name, {"state_dir": "/tmp/clusterx-registry-test"} if name == "fake" else {})
        assert backend.name == name == info.name
    assert pollable_backends() == ["slurm", "fake"]
    assert daemon_backends() == ["local"]
    assert backend_info("slurm").supports_requeue and not backend_info("local").supports_requeue


def test_the_command_line_offers_exactly_the_registered_backends() -> None:
    option = next(p for p in submit.params if p.name == "backend")
    assert tuple(option.type.choices) == tuple(BACKENDS)  # type: ignore[attr-defined]  # a click.Choice


def test_an_unknown_backend_is_refused_with_the_known_ones() -> None:
    with pytest.raises(SpecError, match=r"key 'backend': unknown backend 'pbs'; choose one of local, slurm, fake"):
        JobSpec.from_mapping({"command": ["true"], "backend": "pbs"})
    with pytest.raises(SpecError, match="unknown backend 'pbs'"):
        get_backend("pbs")


def test_queued_jobs_are_cancelled_at_once_only_where_the_queue_is_the_database(db_url: str, tmp_path: Path) -> None:
    client = Client(db_url, runs_dir=tmp_path / "runs", poll_interval_s=0)
    local = client.submit(JobSpec(command=["true"], backend_options={"autostart": "false"}))
    fake = client.submit(
        JobSpec(command=["true"], backend="fake", backend_options={"state_dir": str(tmp_path / "fake")})
    )
    assert local.state == fake.state == "QUEUED"
    # The local job's queue is this database: nobody else holds it, so it ends now. The fake cluster holds the
    # other one: it stays live until the cluster confirms.
    assert client.store.request_cancel(local.id, "test") is JobState.CANCELLED
    assert client.store.request_cancel(fake.id, "test") is JobState.QUEUED
    client.close()


def test_job_states_are_typed_in_python_and_names_in_the_database(db_url: str, tmp_path: Path) -> None:
    client = Client(db_url, runs_dir=tmp_path / "runs")
    record = client.submit(JobSpec(command=["true"], backend_options={"autostart": "false"}))
    job = client.store.get(record.id)
    assert type(job.state) is JobState and job.state is JobState.QUEUED
    assert all(type(e.to_state) is JobState for e in client.store.events(job.id))
    assert all(type(a.state) is JobState for a in client.store.attempts(job.id))
    assert record.state is JobState.QUEUED and record.to_dict()["state"] == "QUEUED"  # JSON holds plain names
    assert type(record.to_dict()["state"]) is str
    with client.store.engine.begin() as connection:
        assert connection.execute(text("SELECT state FROM jobs")).scalar_one() == "QUEUED"
        # A word that is no state cannot be read back as one.
        connection.execute(text("UPDATE jobs SET state = 'BOGUS'"))
    with client.store.engine.connect() as connection, pytest.raises(ValueError, match="'BOGUS' is not a valid"):
        connection.execute(select(Job.state)).scalar_one()
    client.close()
