"""`clusterx.Client`: the Python API; the command line is a thin layer over it.

Jobs are returned as `clusterx.record.JobRecord`s: the same typed, versioned contract that `clusterx describe --json`
prints.

Backends without a daemon of ours (Slurm, fake) are polled by the client: `list`, `describe` and `wait` first
ask each such backend, in one call for all its live jobs, what it sees (at most every `poll_interval_s`), and
record the answer through the store, which ignores stale answers.
"""

from __future__ import annotations

import contextlib
import getpass
import socket
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from clusterx.backends import backend_info, get_backend, pollable_backends
from clusterx.backends.base import Backend, BackendStatus, SubmitRequest
from clusterx.daemon.messages import (
    CancelReply,
    CancelRequest,
    PriorityRequest,
    R,
    RecordReply,
    Request,
    RetryRequest,
)
from clusterx.db.engine import resolve_db_url
from clusterx.db.models import Job, utcnow
from clusterx.db.record import job_record
from clusterx.errors import BackendError, ClusterxError, JobNotFoundError, JobStateError, NotOwnerError, SpecError
from clusterx.ownership import ROOT_UID, not_owner_message, user_name
from clusterx.paths import attempt_dir, default_runs_dir
from clusterx.record import JobRecord, read_job_record
from clusterx.spec import JobSpec
from clusterx.states import JobState
from clusterx.store import JobStore

# A polled job its backend no longer reports, this long after submission, is LOST (its end was never seen).
LOST_AFTER = timedelta(minutes=2)
RETRYABLE_STATES = (JobState.FAILED, JobState.NODE_FAIL)
# What a run the backend requeued itself is recorded as: its cause (node failure, preemption, an administrator's
# requeue) is not reported, and the job lives on.
REQUEUED_REASON = "requeued by {backend} (a node failure, a preemption or an administrator's requeue)"
# A job still PENDING this long after it was stored lost its submitter (a backend's submit takes seconds).
STUCK_PENDING_AFTER = timedelta(minutes=5)
# How far before the newest change seen a reader of `changed_since` should look again (see there).
CHANGES_OVERLAP = timedelta(seconds=5)


class Client:
    def __init__(
        self,
        db: str | None = None,
        *,
        user: str | None = None,
        runs_dir: str | Path | None = None,
        poll_interval_s: float = 2.0,
        via_daemon: bool = True,
    ) -> None:
        """`db`: a SQLite file path or a database URL; None means CLUSTERX_DB, else the user's default file.
        `via_daemon`: cancel, retry and priority changes of a daemon backend's jobs are asked of the running daemon,
        which checks the caller's identity (clusterx.ownership); False in the daemon itself."""
        self.url = resolve_db_url(db)
        self.store = JobStore(self.url)
        self.user = user or getpass.getuser()
        self.host = socket.gethostname()
        self.runs_dir = Path(runs_dir) if runs_dir else default_runs_dir(self.url)
        self.poll_interval_s = poll_interval_s
        self._last_poll = float("-inf")
        # Backends that could not be asked at the last poll (e.g. slurmctld down), one message each: the jobs keep
        # the state last seen, and the CLI shows these as warnings instead of failing `list` and `describe`.
        self.poll_errors: list[str] = []
        self._backends: dict[tuple[str, tuple[tuple[str, str], ...]], Backend] = {}
        self.via_daemon = via_daemon

    def close(self) -> None:
        self.store.close()

    # -- submitting ---------------------------------------------------------------------------------------------
    def prepare(self, spec: JobSpec) -> JobSpec:
        """The spec as it will be stored: absolute workdir and run_dir filled in; resources checked."""
        workdir = str(Path(spec.workdir or Path.cwd()).resolve())
        run_dir = spec.run_dir or str(self.runs_dir / f"{spec.name}-{spec.submit_key[:8]}")
        spec = spec.model_copy(update={"workdir": workdir, "run_dir": str(Path(run_dir).resolve())})
        self._backend(spec.backend, spec.backend_options).check(spec)
        return spec

    def dryrun(self, spec: JobSpec) -> str:
        """What `submit` would send to the backend (for Slurm, the sbatch script). Stores nothing."""
        spec = self.prepare(spec)
        backend = self._backend(spec.backend, spec.backend_options)
        assert spec.run_dir is not None  # prepare() sets it
        return backend.dryrun(SubmitRequest(0, 1, spec.model_dump_json(), attempt_dir(spec.run_dir, 1)))

    def submit(self, spec: JobSpec, *, retry_of: int | None = None) -> JobRecord:
        """Store the job, hand it to its backend, return its record. Submitting a spec whose submit_key is
        already stored returns that job unchanged."""
        spec = self.prepare(spec)
        assert spec.run_dir is not None  # prepare() sets it
        backend = self._backend(spec.backend, spec.backend_options)
        now = utcnow()
        job, created = self.store.insert_job(
            Job(
                submit_key=spec.submit_key,
                name=spec.name,
                user=self.user,
                submit_host=self.host,
                backend=spec.backend,
                state=JobState.PENDING,
                spec=spec.model_dump(mode="json"),
                run_dir=spec.run_dir,
                log_paths={},
                hosts=[],
                rank_to_host={},
                attempt=1,
                max_retries=spec.max_retries,
                priority=spec.priority,
                nodes=spec.nodes,
                cpus=spec.cpus_needed,
                gpus=spec.gpus_per_node,
                mem_mib=spec.mem_per_node or 0,
                time_limit_s=spec.time_limit,
                cancel_requested=False,
                retry_of=retry_of,
                created_at=now,
                updated_at=now,
            ),
            source="client",
            message=f"submitted by {self.user}@{self.host}",
        )
        if created:
            self._hand_to_backend(job.id, 1, spec, backend)
        elif self._stuck_in_pending(job) and self.store.claim_handoff(job.id, job.updated_at):
            self.store.note(job.id, "client", "its first submitter never handed it to the backend; handing it now")
            self._hand_to_backend(job.id, 1, JobSpec.model_validate(job.spec), backend)
        return self.describe(job.id, poll=False)

    @staticmethod
    def _stuck_in_pending(job: Job) -> bool:
        """Stored, but its submitter died before handing it to the backend (a repeated submit recovers it)."""
        return (
            job.state == JobState.PENDING
            and job.backend_job_id is None
            and utcnow() - job.updated_at > STUCK_PENDING_AFTER
        )

    def _hand_to_backend(self, job_id: int, attempt: int, spec: JobSpec, backend: Backend) -> str:
        assert spec.run_dir is not None
        request = SubmitRequest(job_id, attempt, spec.model_dump_json(), attempt_dir(spec.run_dir, attempt))
        try:
            rendered = backend.dryrun(request)
            backend_job_id = backend.submit(request)
        except Exception as exc:
            reason = f"the {backend.name} backend refused the job: {exc}"
            self.store.apply(
                job_id, "client", reason, JobState.FAILED, fields={"failure_reason": reason, "raw_state": "REFUSED"}
            )
            if isinstance(exc, ClusterxError):
                raise
            raise ClusterxError(reason) from exc
        log_paths = {key: str(path) for key, path in backend.log_paths(request).items()}
        self.store.apply(
            job_id,
            "client",
            f"accepted by the {backend.name} backend as {backend_job_id}",
            JobState.QUEUED,
            fields={
                "backend_job_id": backend_job_id,
                "rendered_request": rendered,
                "log_paths": log_paths,
                "submitted_at": utcnow(),
                "raw_state": "SUBMITTED",
            },
            attempt_fields={"state": JobState.QUEUED, "backend_job_id": backend_job_id},
        )
        return backend_job_id

    # -- reading ------------------------------------------------------------------------------------------------
    def read_many(self, job_ids: Iterable[int], *, poll: bool = True) -> list[JobRecord]:
        """The records of these jobs (as `list` gives them: no events or attempts), in id order, read in one
        query per 500 ids; an id with no job is left out."""
        if poll:
            self.reconcile()
        return self.store.records_by_ids(job_ids)

    def changed_since(self, since: datetime, *, poll: bool = True) -> list[JobRecord]:
        """The records of jobs created or changed at or after `since` (their `updated_at`), oldest change first.

        `updated_at` is the writing client's clock when its transaction ran, so a change committed a moment later,
        or written by a host whose clock lags, can carry a time just before one already read past. Reading again
        from a little before the newest `updated_at` seen (CHANGES_OVERLAP) keeps those: a job read twice is the
        same record twice."""
        if poll:
            self.reconcile()
        return self.store.records_changed_since(since)

    def list(
        self,
        *,
        states: Iterable[str] = (),
        user: str | None = None,
        name: str | None = None,
        backend: str | None = None,
        limit: int | None = 50,
        poll: bool = True,
    ) -> list[JobRecord]:
        """Job records, newest first."""
        if poll:
            self.reconcile()
        return self.store.list_records(states=states, user=user, name=name, backend=backend, limit=limit)

    def describe(self, job_id: int, *, poll: bool = True) -> JobRecord:
        """The full job record, with its events and attempts."""
        if poll:
            self.reconcile()
        job = self.store.get(job_id)
        return job_record(job, self.store.events(job_id), self.store.attempts(job_id))

    def wait(self, job_id: int, timeout_s: float | None = None, interval_s: float = 0.5) -> JobRecord:
        """Block until the job ends; returns its record (a live one when `timeout_s` ran out)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        job = self.store.get(job_id)
        if backend_info(job.backend).needs_daemon and not job.state.is_terminal:
            self._ensure_daemon()
        while True:
            self.reconcile(force=time.monotonic() - self._last_poll >= max(interval_s, 1.0))
            job = self.store.get(job_id)
            if job.state.is_terminal or (deadline is not None and time.monotonic() >= deadline):
                return self.describe(job_id, poll=False)
            time.sleep(interval_s)

    # -- changing -----------------------------------------------------------------------------------------------
    def cancel(self, job_ids: Iterable[int]) -> dict[int, JobState]:
        """Cancel jobs (idempotent: an ended job is left as it is). Returns each job's state afterwards;
        a running job shows its state until its backend confirms the cancellation.

        Live jobs of a daemon backend are cancelled by the daemon, which checks who asks (SO_PEERCRED); the others
        here, by the same rule (clusterx.ownership) applied to this process's user. Nothing is cancelled when one
        of the jobs may not be."""
        jobs = [self.store.get(job_id) for job_id in job_ids]
        by_daemon = [job.id for job in jobs if self._daemon_acts_on(job)]
        here = [job.id for job in jobs if job.id not in by_daemon]
        for job in jobs:
            if job.id in here:
                self._require_owner(job, "cancel")
        result: dict[int, JobState] = {}
        if by_daemon:
            answer = self._ask_daemon(CancelRequest(by_daemon), CancelReply)
            if answer is None:  # no daemon answers: the same rule, applied here
                for job in jobs:
                    if job.id in by_daemon:
                        self._require_owner(job, "cancel")
                here += by_daemon
            else:
                result.update({int(job_id): JobState(state) for job_id, state in answer.states.items()})
        result.update(self.cancel_here(here, source=f"client:{self.user}"))
        return {job.id: result[job.id] for job in jobs}

    def cancel_here(self, job_ids: Iterable[int], *, source: str) -> dict[int, JobState]:
        """Cancel in this process, the caller's right to do so already checked."""
        result = {}
        for job_id in job_ids:
            job = self.store.get(job_id)
            if job.state.is_terminal:
                result[job.id] = job.state
                continue
            backend = self._backend(job.backend, job.spec.get("backend_options", {}))
            # The database first: where it keeps each role to its own jobs (see docs, Ownership), a refusal stops
            # the cancel before the backend hears of it. Asking again after a failed backend call is harmless.
            result[job.id] = self.store.request_cancel(job.id, source)
            if job.backend_job_id and not job.state.is_terminal:
                backend.cancel(job.backend_job_id)  # a daemon backend sends nothing: the flag is its signal
            if backend_info(job.backend).needs_daemon and not result[job.id].is_terminal:
                self._ensure_daemon()  # the daemon acts on the cancel flag: make sure one runs
        return result

    def retry(self, job_id: int) -> JobRecord:
        """A new job from an ended job's spec (same run directory, so training resumes from its checkpoints),
        linked to it by `retry_of`. The ended job itself never changes. A daemon backend's job is retried by its
        daemon (which runs the new job as its own user, so only that user or root may)."""
        job = self.store.get(job_id)
        if not job.state.is_terminal:
            raise JobStateError(f"job {job_id} is still {job.state}; wait for it or cancel it before retrying")
        if self.via_daemon and backend_info(job.backend).needs_daemon:
            answer = self._ask_daemon(RetryRequest(job_id), RecordReply)
            if answer is not None:
                return read_job_record(answer.record, "the daemon's reply")
        self._require_owner(job, "retry")
        spec = JobSpec.model_validate(job.spec).model_copy(update={"submit_key": uuid.uuid4().hex})
        return self.submit(spec, retry_of=job_id)

    def set_priority(self, job_id: int, priority: int) -> JobRecord:
        """Change a queued or running job's priority (it orders the daemon's queue). Only for jobs a clusterx daemon
        schedules: a polled backend's queue order is that backend's own."""
        job = self.store.get(job_id)
        if job.state.is_terminal:
            raise JobStateError(f"job {job_id} has ended ({job.state}); its priority no longer matters")
        if not backend_info(job.backend).needs_daemon:
            raise JobStateError(
                f"job {job_id} runs on the {job.backend} backend, which orders its own queue; only jobs the clusterx "
                "daemon schedules can change priority"
            )
        if self.via_daemon:
            answer = self._ask_daemon(PriorityRequest(job_id, priority), RecordReply)
            if answer is not None:
                return read_job_record(answer.record, "the daemon's reply")
        self._require_owner(job, "change")
        return self.set_priority_here(job_id, priority, f"client:{self.user}")

    def set_priority_here(self, job_id: int, priority: int, source: str) -> JobRecord:
        """Change the priority in this process, the caller's right to do so already checked."""
        self.store.set_priority(job_id, priority, source)
        return self.describe(job_id, poll=False)

    def _daemon_acts_on(self, job: Job) -> bool:
        return self.via_daemon and backend_info(job.backend).needs_daemon and not job.state.is_terminal

    def _require_owner(self, job: Job, action: str) -> None:
        """The rule of clusterx.ownership where no daemon checks, for the user this client acts as."""
        if self.user not in (job.user, user_name(ROOT_UID)):
            raise NotOwnerError(not_owner_message(job.id, job.user, action, self.user))

    def _ask_daemon(self, request: Request, expected: type[R]) -> R | None:
        """The daemon's answer (a refusal raised as its error); None when no daemon can be asked."""
        from clusterx.daemon.fastpath import Unreachable, request_daemon  # noqa: PLC0415

        answer = request_daemon(self.url, request, expected)
        return None if isinstance(answer, Unreachable) else answer

    def log_file(self, job_id: int, stream: str = "stdout", rank: int | None = None) -> Path:
        """The file holding a job's output: its stdout/stderr, or one rank's log (`rank`)."""
        job = self.store.get(job_id)
        if rank is not None:
            key = f"rank-{rank}"
            if key in job.log_paths:
                return Path(job.log_paths[key])
            return Path(job.run_dir) / "logs" / f"rank-{rank}.log"  # the run directory's own per-rank logs
        if stream not in ("stdout", "stderr"):
            raise SpecError(f"unknown log stream {stream!r}; use stdout or stderr")
        if stream in job.log_paths:
            return Path(job.log_paths[stream])
        return attempt_dir(job.run_dir, job.attempt) / f"{stream}.log"

    def is_live(self, job_id: int) -> bool:
        """True while the job has not ended (asks polled backends first, rate-limited)."""
        self.reconcile()
        return not self.store.get(job_id).state.is_terminal

    # -- polling backends ---------------------------------------------------------------------------------------
    def reconcile(self, *, force: bool = False) -> None:
        """Ask the polled backends about their live jobs (rate-limited) and record what they say."""
        now = time.monotonic()
        if not force and now - self._last_poll < self.poll_interval_s:
            return
        self._last_poll = now
        self.poll_errors = []
        live = self.store.live_jobs(pollable_backends())
        groups: dict[tuple[str, tuple[tuple[str, str], ...]], list[Job]] = {}
        for job in live:
            if job.backend_job_id:
                options = tuple(sorted(job.spec.get("backend_options", {}).items()))
                groups.setdefault((job.backend, options), []).append(job)
        for (name, options), jobs in groups.items():
            backend = self._backend(name, dict(options))
            try:
                statuses = backend.poll([job.backend_job_id for job in jobs if job.backend_job_id])
            except BackendError as error:
                self.poll_errors.append(f"could not ask the {name} backend about {len(jobs)} live job(s): {error}")
                continue
            for job in jobs:
                # A job just read but not found for writing is another role's on a database that keeps each role
                # to its own rows (docs/clusterx.md, Ownership): its owner's clients record it.
                with contextlib.suppress(JobNotFoundError):
                    self._record_poll(job, statuses.get(job.backend_job_id or ""), backend)

    def _record_poll(self, job: Job, status: BackendStatus | None, backend: Backend) -> None:
        if status is not None:
            self._record_status(job, status, backend)
        elif job.submitted_at is not None and utcnow() - job.submitted_at > LOST_AFTER:
            reason = f"the {backend.name} backend no longer knows job {job.backend_job_id}"
            self.store.apply(
                job.id, f"poll:{backend.name}", reason, JobState.LOST,
                fields={"failure_reason": reason}, expect_attempt=job.attempt,
            )  # fmt: skip

    def _record_status(self, job: Job, status: BackendStatus, backend: Backend) -> None:
        source = f"poll:{backend.name}"
        job = self._count_requeues(job, status, backend, source)
        fields: dict[str, Any] = {"raw_state": status.raw_state}
        if status.exit_code is not None:
            fields["exit_code"] = status.exit_code
        if status.reason:
            fields["failure_reason"] = status.reason
        if status.hosts:
            fields["hosts"] = list(status.hosts)
        if status.rank_to_host:
            fields["rank_to_host"] = {str(rank): host for rank, host in status.rank_to_host.items()}
        if status.started_at is not None:
            fields["started_at"] = status.started_at
        if status.ended_at is not None:
            fields["ended_at"] = status.ended_at
        attempt_fields = {
            "state": status.state,
            "backend_job_id": status.backend_job_id,
            "exit_code": status.exit_code,
            "reason": status.reason,
            "host": status.hosts[0] if status.hosts else None,
            "started_at": status.started_at,
            "ended_at": status.ended_at or (utcnow() if status.state.is_terminal else None),
        }
        message = f"{backend.name} reports {status.raw_state}" + (f": {status.reason}" if status.reason else "")
        if status.state in RETRYABLE_STATES and job.attempt <= job.max_retries:
            retry_message = f"attempt {job.attempt} {status.state.value.lower()} ({message}); retrying"
            if self.store.requeue_for_retry(job.id, job.attempt, source, retry_message, attempt_fields):
                spec = JobSpec.model_validate(job.spec)
                self._hand_to_backend(job.id, job.attempt + 1, spec, backend)
            return
        self.store.apply(
            job.id, source, message, status.state, fields=fields, expect_attempt=job.attempt,
            attempt_fields=attempt_fields,
        )  # fmt: skip

    def _count_requeues(self, job: Job, status: BackendStatus, backend: Backend, source: str) -> Job:
        """A backend that requeued the job itself (Slurm, with `requeue`) runs it again under the same id: each
        run it ended becomes a closed attempt and the next run the next attempt, as a local retry is (the run
        itself sees that number as CLUSTERX_ATTEMPT). Returns the job as it is now."""
        if not (backend_info(job.backend).supports_requeue and job.spec.get("requeue")):
            return job  # submitted with --no-requeue: never requeued, whatever an old file might say
        runs_ended = 0
        if status.restarts is not None:
            same_id = [a.attempt for a in self.store.attempts(job.id) if a.backend_job_id == status.backend_job_id]
            runs_ended = min(same_id, default=job.attempt) + status.restarts - job.attempt
        if status.state is JobState.QUEUED and job.state in (JobState.STARTING, JobState.RUNNING):
            runs_ended = max(runs_ended, 1)  # it ran and waits again: requeued, its next run not begun
        for _ in range(runs_ended):
            message = f"attempt {job.attempt} {REQUEUED_REASON.format(backend=backend.name)}; it runs again as " + (
                f"attempt {job.attempt + 1}"
            )
            ended = {"state": JobState.PREEMPTED, "reason": REQUEUED_REASON.format(backend=backend.name)}
            if not self.store.requeue_for_retry(job.id, job.attempt, source, message, {**ended, "ended_at": utcnow()}):
                break
            job = self.store.get(job.id)
        return job

    def _backend(self, name: str, options: Mapping[str, str]) -> Backend:
        key = (name, tuple(sorted(options.items())))
        if key not in self._backends:
            self._backends[key] = get_backend(name, options, db_url=self.url)
        return self._backends[key]

    def _ensure_daemon(self) -> None:
        from clusterx.daemon.control import start_daemon  # noqa: PLC0415 (lazy: only local jobs need it)

        start_daemon(self.url)
