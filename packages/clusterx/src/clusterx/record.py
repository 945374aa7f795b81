"""The job record: the typed, versioned contract that `clusterx describe ID --json` prints, `clusterx.Client`
returns, and xtop and `deeptrace analyze --job` read (docs/clusterx.md, "The job record").

Fields are only ever added, never renamed or removed; `record_version` goes up when one is added, so a reader
refuses a record newer than it knows with one message instead of misreading it. This module loads pydantic and the
spec only (no SQLAlchemy): the readers in other packages stay quick to start. Records of stored jobs are built by
clusterx.db.record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clusterx.errors import ClusterxError
from clusterx.spec import JobSpec, describe_validation_error
from clusterx.states import JobState

RECORD_VERSION = 1


class JobRecordError(ClusterxError):
    """A job record this clusterx cannot read (a newer version, or not a record); the message says which."""


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobEventRecord(_Record):
    """One state change of a job (or a note, such as a retry)."""

    at: datetime
    attempt: int
    from_state: JobState | None
    to_state: JobState
    source: str
    message: str


class AttemptRecord(_Record):
    """One run of a job."""

    attempt: int
    backend_job_id: str | None
    state: JobState
    exit_code: int | None
    reason: str | None
    host: str | None
    pid: int | None
    log_dir: str | None
    started_at: datetime | None
    ended_at: datetime | None


class JobRecord(_Record):
    """One job as clusterx reports it. `events` and `attempts` are filled by `describe` and absent (None) from the
    records `list` returns, which is why they are left out of the JSON when None."""

    record_version: int = RECORD_VERSION
    id: int
    submit_key: str
    name: str
    user: str
    submit_host: str
    backend: str
    backend_job_id: str | None
    state: JobState
    raw_state: str | None
    spec: JobSpec
    rendered_request: str | None
    run_dir: str
    log_paths: dict[str, str]
    hosts: list[str]
    rank_to_host: dict[str, str] = Field(description="global rank (a string, as JSON keys are) → host")
    exit_code: int | None
    failure_reason: str | None
    attempt: int
    max_retries: int
    priority: int
    retry_of: int | None
    cancel_requested: bool
    created_at: datetime
    submitted_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    updated_at: datetime
    events: list[JobEventRecord] | None = None
    attempts: list[AttemptRecord] | None = None

    @property
    def live(self) -> bool:
        return not self.state.is_terminal

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON values (times as ISO 8601 with 'Z'), without the absent events and attempts."""
        absent = {name for name in ("events", "attempts") if getattr(self, name) is None}
        return self.model_dump(mode="json", exclude=absent)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def summary(self) -> str:
        """The one line `clusterx submit` prints."""
        return f"job {self.id} {self.state} on {self.backend}: run dir {self.run_dir}"


def read_job_record(data: str | bytes | Mapping[str, Any], source: str = "job record") -> JobRecord:
    """A JobRecord from its JSON (text or parsed); a newer version or anything else unreadable raises
    JobRecordError whose message starts with `source`."""
    try:
        obj = json.loads(data) if isinstance(data, str | bytes) else data
    except ValueError as error:
        raise JobRecordError(f"{source}: not JSON ({error})") from None
    if not isinstance(obj, Mapping):
        raise JobRecordError(f"{source}: not a job record (a JSON {type(obj).__name__}, not an object)")
    version = obj.get("record_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise JobRecordError(f"{source}: not a job record (record_version missing or not an integer)")
    if version > RECORD_VERSION:
        raise JobRecordError(
            f"{source}: job record version {version} is newer than this clusterx reads ({RECORD_VERSION}): "
            "upgrade clusterx"
        )
    try:
        return JobRecord.model_validate(obj)
    except ValidationError as error:
        raise JobRecordError(describe_validation_error(error, source, JobRecord)) from None
