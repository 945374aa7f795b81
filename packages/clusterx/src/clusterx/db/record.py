"""The JobRecord of a stored job (the one writer of clusterx.record's contract).

The record's fields are read from the database rows by name (pydantic's from_attributes): a field added to the
record is filled from the column of the same name, with no list of fields to keep in step here.
"""

from __future__ import annotations

from typing import Any

from clusterx.db.models import Attempt, Job, JobEvent
from clusterx.record import AttemptRecord, JobEventRecord, JobRecord


def job_record(job: Job, events: list[JobEvent] | None = None, attempts: list[Attempt] | None = None) -> JobRecord:
    record = JobRecord.model_validate(job, from_attributes=True)
    parts: dict[str, Any] = {}
    if events is not None:
        parts["events"] = [JobEventRecord.model_validate(event, from_attributes=True) for event in events]
    if attempts is not None:
        parts["attempts"] = [AttemptRecord.model_validate(attempt, from_attributes=True) for attempt in attempts]
    return record.model_copy(update=parts) if parts else record
