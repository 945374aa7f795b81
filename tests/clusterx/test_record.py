"""The job record as one typed, versioned contract: what `describe --json` prints is a JobRecord that reads back
equal to the Client's, list's records leave out events and attempts, and a record newer than the reader, or one
that is not a record, is refused with one message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from clusterx import Client, JobSpec
from clusterx.cli import main
from clusterx.record import RECORD_VERSION, JobRecord, JobRecordError, read_job_record
from clusterx.states import JobState


@pytest.fixture
def submitted(sqlite_db: str, tmp_path: Path) -> tuple[Client, JobRecord]:
    client = Client(sqlite_db, runs_dir=tmp_path / "runs", poll_interval_s=0)
    spec = JobSpec(command=["train"], backend="fake", backend_options={"state_dir": str(tmp_path / "fake")})
    return client, client.submit(spec)


def _cli(db: str, *args: str) -> str:
    result = CliRunner().invoke(main, ["--db", db, *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_describe_json_round_trips_through_job_record(submitted: tuple[Client, JobRecord], sqlite_db: str) -> None:
    client, record = submitted
    printed = _cli(sqlite_db, "describe", str(record.id), "--json")
    read = read_job_record(printed)
    described = client.describe(record.id, poll=False)
    assert read == described
    assert printed == described.to_json() + "\n"  # the writer is the one serializer
    assert read.record_version == RECORD_VERSION and read.state is JobState.QUEUED
    assert read.spec.command == ["train"] and read.created_at.tzinfo is not None
    assert read.events and read.events[0].to_state is JobState.PENDING and read.attempts
    assert json.loads(printed)["created_at"].endswith("Z")  # times as before: UTC, ISO 8601 with 'Z'


def test_list_json_records_leave_out_events_and_attempts(submitted: tuple[Client, JobRecord], sqlite_db: str) -> None:
    client, _ = submitted
    listed = json.loads(_cli(sqlite_db, "list", "--json"))
    assert "events" not in listed[0] and "attempts" not in listed[0]
    assert [read_job_record(item) for item in listed] == client.list(poll=False)
    assert client.list(poll=False)[0].events is None


def test_a_newer_record_version_is_refused_with_one_message(submitted: tuple[Client, JobRecord]) -> None:
    _, record = submitted
    newer = {**record.to_dict(), "record_version": RECORD_VERSION + 1, "a_field_of_later": 1}
    with pytest.raises(JobRecordError) as refused:
        read_job_record(json.dumps(newer), source="clusterx describe 1 --json")
    assert str(refused.value) == (
        f"clusterx describe 1 --json: job record version {RECORD_VERSION + 1} is newer than this clusterx reads "
        f"({RECORD_VERSION}): upgrade clusterx"
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "a JSON list, not an object"),
        ('{"id": 1}', "record_version missing"),
        ('{"record_version": true}', "record_version missing or not an integer"),
    ],
)
def test_what_is_not_a_record_is_refused(text: str, says: str) -> None:
    with pytest.raises(JobRecordError, match=says):
        read_job_record(text)


def test_an_unknown_or_mistyped_field_of_this_version_is_refused(submitted: tuple[Client, JobRecord]) -> None:
    _, record = submitted
    with pytest.raises(JobRecordError, match=r"^job record: key 'surprise': unknown key \(known keys: attempt, "):
        read_job_record({**record.to_dict(), "surprise": 1})
    with pytest.raises(JobRecordError, match=r"^job record: key 'state': Input should be 'PENDING', "):
        read_job_record({**record.to_dict(), "state": "SLEEPING"})
