"""The job record as JSON: the stable contract that `clusterx describe ID --json` prints and that xtop and
deeptrace read (docs/clusterx.md, "The job record"). Fields are only ever added, never renamed or removed;
`record_version` goes up when one is added."""

from __future__ import annotations

from typing import Any

from clusterx.db.models import Attempt, Job, JobEvent
from clusterx.store import iso

RECORD_VERSION = 1


def job_record(job: Job, events: list[JobEvent] | None = None, attempts: list[Attempt] | None = None) -> dict[str, Any]:
    record: dict[str, Any] = {
        "record_version": RECORD_VERSION,
        "id": job.id,
        "submit_key": job.submit_key,
        "name": job.name,
        "user": job.user,
        "submit_host": job.submit_host,
        "backend": job.backend,
        "backend_job_id": job.backend_job_id,
        "state": job.state.value,
        "raw_state": job.raw_state,
        "spec": job.spec,
        "rendered_request": job.rendered_request,
        "run_dir": job.run_dir,
        "log_paths": job.log_paths,
        "hosts": job.hosts,
        "rank_to_host": job.rank_to_host,
        "exit_code": job.exit_code,
        "failure_reason": job.failure_reason,
        "attempt": job.attempt,
        "max_retries": job.max_retries,
        "priority": job.priority,
        "retry_of": job.retry_of,
        "cancel_requested": job.cancel_requested,
        "created_at": iso(job.created_at),
        "submitted_at": iso(job.submitted_at),
        "started_at": iso(job.started_at),
        "ended_at": iso(job.ended_at),
        "updated_at": iso(job.updated_at),
    }
    if events is not None:
        record["events"] = [
            {
                "at": iso(e.at),
                "attempt": e.attempt,
                "from_state": e.from_state.value if e.from_state else None,
                "to_state": e.to_state.value,
                "source": e.source,
                "message": e.message,
            }
            for e in events
        ]
    if attempts is not None:
        record["attempts"] = [
            {
                "attempt": a.attempt,
                "backend_job_id": a.backend_job_id,
                "state": a.state.value,
                "exit_code": a.exit_code,
                "reason": a.reason,
                "host": a.host,
                "pid": a.pid,
                "log_dir": a.log_dir,
                "started_at": iso(a.started_at),
                "ended_at": iso(a.ended_at),
            }
            for a in attempts
        ]
    return record
