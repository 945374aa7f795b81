"""The Python API over a polled backend (the fake one, played through its state files), on SQLite and on
PostgreSQL: submit, idempotency, dry runs, reconciliation by polling, retries, LOST, cancel, retry of a job."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from clusterx import Client, JobSpec
from clusterx.backends.fake import write_fake_state
from clusterx.db.models import Job, utcnow
from clusterx.errors import JobStateError, NotOwnerError, ResourceError, SpecError


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


def test_submit_stores_and_hands_to_the_backend(client: Client, fake_dir: Path, tmp_path: Path) -> None:
    record = client.submit(_spec(fake_dir, name="demo", priority=3))
    assert record.state == "QUEUED"
    assert record.backend_job_id.startswith("fake-")
    assert (fake_dir / f"{record.backend_job_id}.json").exists()
    assert record.run_dir.startswith(str(tmp_path / "runs" / "demo-"))
    assert record.spec.workdir == str(Path.cwd())
    assert record.rendered_request and '"train"' in record.rendered_request
    assert [e.to_state for e in record.events] == ["PENDING", "QUEUED"]
    assert record.priority == 3 and record.user == client.user


def test_repeated_submit_key_returns_the_same_job(client: Client, fake_dir: Path) -> None:
    spec = _spec(fake_dir, submit_key="fixed-key")
    first = client.submit(spec)
    second = client.submit(spec)
    assert first.id == second.id
    assert len(client.list(poll=False)) == 1
    assert len(list(fake_dir.glob("*.json"))) == 1  # the backend saw it once


def test_dryrun_stores_nothing(client: Client, fake_dir: Path) -> None:
    text = client.dryrun(_spec(fake_dir))
    assert '"command": ["train"]' in text
    assert client.list(poll=False) == []
    assert not fake_dir.exists() or not list(fake_dir.glob("*.json"))


def test_polling_records_state_hosts_and_events(client: Client, fake_dir: Path) -> None:
    record = client.submit(_spec(fake_dir, nodes=2, procs_per_node=2))
    bid = record.backend_job_id
    write_fake_state(
        fake_dir,
        bid,
        {
            "state": "RUNNING",
            "raw_state": "R",
            "hosts": ["n1", "n2"],
            "rank_to_host": {"0": "n1", "1": "n1", "2": "n2", "3": "n2"},
        },
    )
    running = client.describe(record.id)
    assert (running.state, running.raw_state, running.hosts) == ("RUNNING", "R", ["n1", "n2"])
    assert running.rank_to_host == {"0": "n1", "1": "n1", "2": "n2", "3": "n2"}
    write_fake_state(fake_dir, bid, {"state": "FAILED", "raw_state": "OUT_OF_MEMORY", "exit_code": 137})
    ended = client.wait(record.id, timeout_s=10)
    assert (ended.state, ended.raw_state, ended.exit_code) == ("FAILED", "OUT_OF_MEMORY", 137)
    assert [e.to_state for e in ended.events] == ["PENDING", "QUEUED", "RUNNING", "FAILED"]
    assert ended.events[-1].source == "poll:fake"
    # A later, stale answer never changes an ended job.
    write_fake_state(fake_dir, bid, {"state": "RUNNING", "raw_state": "R"})
    assert client.describe(record.id).state == "FAILED"


def test_failed_attempt_with_retries_left_is_resubmitted(client: Client, fake_dir: Path) -> None:
    record = client.submit(_spec(fake_dir, max_retries=1))
    first_bid = record.backend_job_id
    write_fake_state(fake_dir, first_bid, {"state": "FAILED", "exit_code": 1})
    retried = client.describe(record.id)
    assert (retried.state, retried.attempt) == ("QUEUED", 2)
    assert retried.backend_job_id != first_bid
    write_fake_state(fake_dir, retried.backend_job_id, {"state": "SUCCEEDED", "exit_code": 0})
    done = client.describe(record.id)
    assert (done.state, done.attempt) == ("SUCCEEDED", 2)
    assert [(a.attempt, a.state) for a in done.attempts] == [(1, "FAILED"), (2, "SUCCEEDED")]


def test_job_the_backend_forgot_becomes_lost(client: Client, fake_dir: Path) -> None:
    record = client.submit(_spec(fake_dir))
    (fake_dir / f"{record.backend_job_id}.json").unlink()
    assert client.describe(record.id).state == "QUEUED"  # just submitted: not yet
    long_ago = utcnow() - timedelta(minutes=10)
    client.store.apply(record.id, "test", "pretend it is old", fields={"submitted_at": long_ago})
    lost = client.describe(record.id)
    assert lost.state == "LOST" and "no longer knows" in lost.failure_reason


def test_cancel_is_idempotent_and_owner_only(db_url: str, client: Client, fake_dir: Path, tmp_path: Path) -> None:
    record = client.submit(_spec(fake_dir))
    other = Client(db_url, user="mallory", runs_dir=tmp_path / "runs")
    with pytest.raises(
        NotOwnerError, match=r"job \d+ belongs to \w+; mallory may not cancel it \(only \w+, root may\)"
    ):
        other.cancel([record.id])
    client.cancel([record.id])
    assert client.describe(record.id).state == "CANCELLED"  # the backend confirmed on the next poll
    assert client.cancel([record.id])[record.id].value == "CANCELLED"  # again: no error, no change
    assert sum(e.to_state == "CANCELLED" for e in client.describe(record.id).events) == 1


def test_retry_makes_a_new_linked_job(client: Client, fake_dir: Path) -> None:
    record = client.submit(_spec(fake_dir))
    with pytest.raises(JobStateError, match="still QUEUED"):
        client.retry(record.id)
    write_fake_state(fake_dir, record.backend_job_id, {"state": "FAILED", "exit_code": 2})
    client.describe(record.id)
    new = client.retry(record.id)
    assert new.id != record.id and new.retry_of == record.id
    assert new.run_dir == record.run_dir and new.submit_key != record.submit_key
    old = client.describe(record.id)
    assert (old.state, old.exit_code) == ("FAILED", 2)


def test_impossible_local_requests_are_refused_before_storing(client: Client) -> None:
    for fields, message in [
        ({"gpus_per_node": 64}, "GPU"),
        ({"nodes": 3}, "nodes must be 1"),
        ({"cpus_per_node": 100_000}, "CPU cores"),
        ({"mem_per_node": "900T"}, "memory"),
        ({"workdir": "/no/such/dir"}, "does not exist"),
    ]:
        with pytest.raises((ResourceError, SpecError), match=message):
            client.submit(JobSpec.from_mapping({"command": ["true"], **fields}))
    assert client.list(poll=False) == []


def test_unknown_backend_option_is_refused(client: Client, fake_dir: Path) -> None:
    with pytest.raises(SpecError, match="unknown option"):
        client.submit(JobSpec.from_mapping({"command": ["x"], "backend": "fake", "backend_options": {"zz": "1"}}))
    assert client.list(poll=False) == []


def test_repeated_submit_recovers_a_job_its_submitter_left_pending(client: Client, fake_dir: Path) -> None:
    spec = client.prepare(_spec(fake_dir, submit_key="crashed-submitter"))
    stale = utcnow() - timedelta(minutes=10)
    job = Job(
        submit_key=spec.submit_key, name=spec.name, user=client.user, submit_host=client.host, backend="fake",
        state="PENDING", spec=spec.model_dump(mode="json"), run_dir=str(spec.run_dir), log_paths={}, hosts=[],
        rank_to_host={}, attempt=1, max_retries=0, priority=0, nodes=1, cpus=1, gpus=0, mem_mib=0,
        cancel_requested=False, created_at=stale, updated_at=stale,
    )  # fmt: skip
    client.store.insert_job(job, source="client", message="stored, then the submitter died")
    record = client.submit(spec)
    assert record.state == "QUEUED" and record.backend_job_id.startswith("fake-")
    assert client.submit(spec).backend_job_id == record.backend_job_id  # handed over once only
    assert len(list(fake_dir.glob("*.json"))) == 1


def test_an_unreachable_backend_leaves_jobs_as_last_seen_and_says_so(db_url: str, tmp_path: Path) -> None:
    """slurmctld down: `list` and `describe` still answer, with the reason, instead of failing."""
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    # sbatch accepts the job; squeue then fails the way it does when the controller is unreachable.
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 4242\n")
    (bin_dir / "squeue").write_text(
        "#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller' >&2\nexit 1\n"
    )
    for program in ("sbatch", "squeue"):
        (bin_dir / program).chmod(0o755)
    client = Client(db_url, runs_dir=tmp_path / "runs", poll_interval_s=0)
    spec = JobSpec.from_mapping(
        {
            "command": ["train"],
            "backend": "slurm",
            "backend_options": {"bin_dir": str(bin_dir), "state_dir": str(tmp_path / "st")},
        }
    )
    job_id = client.submit(spec).id
    records = client.list()
    assert [r.id for r in records] == [job_id]
    assert records[0].state == "QUEUED"
    assert len(client.poll_errors) == 1
    assert "Unable to contact slurm controller" in client.poll_errors[0]
    assert client.describe(job_id).state == "QUEUED"
