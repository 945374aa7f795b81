"""The JobRecord of a stored job (the one writer of clusterx.record's contract).

The record's fields are read from the database by name: a field added to the record is filled from the column of
the same name, with no list of fields to keep in step here. Two builders, one result:

- `job_record` validates an ORM `Job` (and its events and attempts): `describe`, a single job.
- `records_from_rows` builds records straight from the rows of a Core select of `RECORD_COLUMNS`, without ORM
  objects and without validating again what clusterx validated on the way in (the stored spec is the dump of a
  validated `JobSpec`; the column types already give `JobState`s and UTC datetimes). Reads of many jobs (`list`,
  the reads by id and by change time) use it: on the development VM it costs a fraction of the ORM path's
  ~28 us per job (a test checks the two give equal records).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Row
from sqlalchemy.sql.elements import KeyedColumnElement

from clusterx.db.models import Attempt, Job, JobEvent
from clusterx.record import AttemptRecord, JobEventRecord, JobRecord
from clusterx.spec import JobSpec

# The jobs table's columns that make a record, in the record's field order (events and attempts are other tables).
RECORD_COLUMNS: tuple[KeyedColumnElement[Any], ...] = tuple(
    Job.__table__.c[name] for name in JobRecord.model_fields if name in Job.__table__.c
)
_NAMES = tuple(column.name for column in RECORD_COLUMNS)
_SPEC = _NAMES.index("spec")


def job_record(job: Job, events: list[JobEvent] | None = None, attempts: list[Attempt] | None = None) -> JobRecord:
    record = JobRecord.model_validate(job, from_attributes=True)
    parts: dict[str, Any] = {}
    if events is not None:
        parts["events"] = [JobEventRecord.model_validate(event, from_attributes=True) for event in events]
    if attempts is not None:
        parts["attempts"] = [AttemptRecord.model_validate(attempt, from_attributes=True) for attempt in attempts]
    return record.model_copy(update=parts) if parts else record


def records_from_rows(rows: Iterable[Row[Any] | Sequence[Any]]) -> list[JobRecord]:
    """Records of rows selected as `select(*RECORD_COLUMNS)`: trusted values (see the module doc), not validated."""
    construct, spec_construct, names, spec_at = JobRecord.model_construct, JobSpec.model_construct, _NAMES, _SPEC
    records = []
    for row in rows:
        values = dict(zip(names, row, strict=True))
        values["spec"] = spec_construct(**row[spec_at])
        records.append(construct(**values))
    return records
