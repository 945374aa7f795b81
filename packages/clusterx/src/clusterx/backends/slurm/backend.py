"""SlurmBackend: the clusterx Backend protocol over sbatch, squeue, sacct and scancel.

Polling many jobs costs a fixed number of processes: one squeue for all of them, then, for those squeue no
longer lists as live, one sacct (slurmdbd) or one `sacct -c` (the job-completion log), then the exit-code
files the batch scripts wrote. A job none of these knows is LOST, with the reason.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from clusterx.backends.base import BackendStatus, SubmitRequest
from clusterx.spec import JobSpec
from clusterx.states import JobState

from .commands import AccountingUnavailableError, SlurmCommands
from .nodelist import expand_hostlist, rank_to_host
from .options import SlurmOptions
from .records import SlurmRecord, StatusFile, read_status_file
from .script import log_paths_for, render_sbatch_script, status_file_path
from .states import ExitStatus, combine, map_slurm_state, normalize_state, parse_exit_code, signal_name

SCRIPT_NAME = "sbatch.sh"


def split_backend_id(backend_job_id: str) -> tuple[str, str | None]:
    """'123;cluster' → ('123', 'cluster'); '123' → ('123', None)."""
    job_id, _, cluster = backend_job_id.partition(";")
    return job_id, cluster or None


class SlurmBackend:
    """Runs jobs on a Slurm cluster. `options`: see SlurmOptions (slurm_conf, state_dir, accounting, ...)."""

    name = "slurm"

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        self._backend_options = dict(options or {})
        self.options = SlurmOptions.from_maps(self._backend_options)
        self.commands = SlurmCommands(self.options)
        self._sacct_unavailable = self.options.accounting in ("jobcomp", "none")
        # Rank → host needs procs_per_node, which Slurm does not report: the batch script writes it into its
        # status file; until that exists, what this process submitted, else one rank per host.
        self._procs_per_node: dict[str, int] = {}

    # -- rendering ---------------------------------------------------------------------------------------------

    def _job_options(self, spec: JobSpec) -> SlurmOptions:
        return SlurmOptions.from_maps(self._backend_options, spec.backend_options)

    def render(self, request: SubmitRequest, submit_dir: Path | None = None) -> str:
        spec = JobSpec.model_validate_json(request.spec_json)
        return render_sbatch_script(
            spec,
            job_id=request.job_id,
            attempt=request.attempt,
            log_dir=request.log_dir,
            options=self._job_options(spec),
            submit_dir=submit_dir or Path.cwd(),
        )

    def check(self, spec: JobSpec) -> None:
        """Options are checked here; what the cluster can run, sbatch itself judges at submit."""
        self._job_options(spec)

    def dryrun(self, request: SubmitRequest) -> str:
        return self.render(request)

    def log_paths(self, request: SubmitRequest) -> dict[str, Path]:
        logs = log_paths_for(request.log_dir)
        return {"stdout": logs.stdout, "stderr": logs.stderr}

    # -- submit and cancel -------------------------------------------------------------------------------------

    def submit(self, request: SubmitRequest) -> str:
        spec = JobSpec.model_validate_json(request.spec_json)
        script = self.render(request)
        # Slurm opens the output files but creates no folders: they must exist (on a shared file system).
        request.log_dir.mkdir(parents=True, exist_ok=True)
        self._job_options(spec).resolved_state_dir().mkdir(parents=True, exist_ok=True)
        script_path = request.log_dir / SCRIPT_NAME
        script_path.write_text(script)
        script_path.chmod(0o700)
        backend_job_id = self.commands.sbatch(script_path)
        self._procs_per_node[backend_job_id] = spec.procs_per_node
        return backend_job_id

    def cancel(self, backend_job_id: str) -> None:
        job_id, cluster = split_backend_id(backend_job_id)
        self.commands.scancel(job_id, cluster)

    # -- polling -----------------------------------------------------------------------------------------------

    def poll(self, backend_job_ids: Sequence[str]) -> dict[str, BackendStatus]:
        by_cluster: dict[str | None, dict[str, str]] = defaultdict(dict)
        for backend_job_id in backend_job_ids:
            job_id, cluster = split_backend_id(backend_job_id)
            by_cluster[cluster][job_id] = backend_job_id
        statuses: dict[str, BackendStatus] = {}
        for cluster, ids in by_cluster.items():
            for job_id, status in self._poll_cluster(list(ids), cluster).items():
                # Reported under the id the caller gave, cluster suffix included.
                statuses[ids[job_id]] = replace(status, backend_job_id=ids[job_id])
        return statuses

    def _poll_cluster(self, job_ids: list[str], cluster: str | None) -> dict[str, BackendStatus]:
        queued = self.commands.squeue(job_ids, cluster)
        state_dir = self.options.resolved_state_dir()
        statuses: dict[str, BackendStatus] = {}
        ended: list[str] = []
        for job_id in job_ids:
            record = queued.get(job_id)
            if record is not None and not map_slurm_state(record.raw_state).state.is_terminal:
                # A waiting job's file, when it has one, is from a run Slurm requeued.
                status_file = read_status_file(status_file_path(state_dir, job_id))
                statuses[job_id] = self._status_from_record(job_id, record, status_file)
            else:
                ended.append(job_id)  # finished (squeue may still show its end state) or forgotten
        if not ended:
            return statuses
        accounted = self.accounting_records(ended, cluster)
        for job_id in ended:
            status_file = read_status_file(status_file_path(state_dir, job_id))
            record = accounted.get(job_id) or queued.get(job_id)
            if record is not None:
                statuses[job_id] = self._status_from_record(job_id, record, status_file)
            elif status_file is not None:
                statuses[job_id] = self._status_from_file(job_id, status_file)
            else:
                statuses[job_id] = BackendStatus(
                    backend_job_id=job_id,
                    state=JobState.LOST,
                    raw_state="UNKNOWN",
                    reason="Slurm no longer knows this job (not in squeue, accounting or the completion log) "
                    f"and it left no exit-code file in {state_dir}",
                )
        return statuses

    def accounting_records(self, job_ids: list[str], cluster: str | None) -> dict[str, SlurmRecord]:
        """Finished jobs from slurmdbd when there is one, else from the job-completion log."""
        if not self._sacct_unavailable:
            try:
                return self.commands.sacct(job_ids, cluster, completion_log=False)
            except AccountingUnavailableError:
                self._sacct_unavailable = True  # a cluster property: ask once per backend
        if self.options.accounting in ("auto", "jobcomp"):
            try:
                return self.commands.sacct(job_ids, cluster, completion_log=True)
            except AccountingUnavailableError:
                return {}
        return {}

    def _hosts(
        self, job_id: str, nodelist: str, status_file: StatusFile | None
    ) -> tuple[tuple[str, ...], dict[int, str]]:
        hosts = expand_hostlist(nodelist)
        procs = status_file.procs_per_node if status_file else self._procs_per_node.get(job_id, 1)
        return tuple(hosts), dict(rank_to_host(hosts, procs))

    def _status_from_record(
        self, job_id: str, record: SlurmRecord, status_file: StatusFile | None = None
    ) -> BackendStatus:
        mapped = map_slurm_state(record.raw_state)
        exit_status = parse_exit_code(record.exit_code)
        if exit_status.exit_code is None and status_file is not None and mapped.state.is_terminal:
            exit_status = _exit_from_file(status_file)  # squeue shows no exit codes; the script's file does
        state, reason = combine(mapped, exit_status)
        if not state.is_terminal and record.pending_reason and state is JobState.QUEUED:
            reason = f"waiting: {record.pending_reason}"
        hosts, ranks = self._hosts(
            job_id, record.nodelist or (status_file.nodelist if status_file else ""), status_file
        )
        exit_code = exit_status.exit_code if state.is_terminal else None
        if exit_code == 0 and state not in (JobState.SUCCEEDED, JobState.FAILED):
            exit_code = None  # Slurm writes 0:0 for a cancelled or timed-out job: no exit status was seen
        started = record.started_at if state not in (JobState.QUEUED, JobState.PENDING) else None
        return BackendStatus(
            backend_job_id=job_id,
            state=state,
            raw_state=record.raw_state,
            exit_code=exit_code,
            reason=reason,
            hosts=hosts if state is not JobState.QUEUED else (),
            rank_to_host=ranks if state is not JobState.QUEUED else {},
            # squeue's start time of a waiting job is only Slurm's forecast
            started_at=started or (status_file.started_at if status_file else None),
            ended_at=record.ended_at or (status_file.ended_at if status_file else None),
            restarts=_restarts(state, status_file),
        )

    def _status_from_file(self, job_id: str, status_file: StatusFile) -> BackendStatus:
        """The last resort: what the batch script itself recorded."""
        state, raw_state, exit_code, reason = _end_from_file(status_file)
        hosts, ranks = self._hosts(job_id, status_file.nodelist, status_file)
        return BackendStatus(
            backend_job_id=job_id,
            state=state,
            raw_state=raw_state,
            exit_code=exit_code,
            reason=reason,
            hosts=hosts,
            rank_to_host=ranks,
            started_at=status_file.started_at,
            ended_at=status_file.ended_at,
            restarts=status_file.restarts,
        )


def _restarts(state: JobState, status_file: StatusFile | None) -> int | None:
    """Slurm's restart count of the job's current run. The file is written by each run as it starts: a running or
    ended job's file is its own run's; a waiting job's file is the run before, which Slurm requeued."""
    if status_file is None:
        return None
    return status_file.restarts + 1 if state is JobState.QUEUED else status_file.restarts


def _end_from_file(status_file: StatusFile) -> tuple[JobState, str, int | None, str | None]:
    """(state, raw state, exit code, reason) from an exit-code file alone."""
    ended_by_slurm = _ended_by_slurm(status_file)
    if ended_by_slurm is not None:
        state, reason = ended_by_slurm
        raw_state = f"EXIT_FILE slurm={status_file.slurm_state}|{status_file.slurm_reason}"
        return state, raw_state, None, reason
    if status_file.exit_code is not None:
        exit_status = _exit_from_file(status_file)
        state = JobState.SUCCEEDED if status_file.exit_code == 0 else JobState.FAILED
        return state, f"EXIT_FILE exit={status_file.exit_code}", exit_status.exit_code, exit_status.reason
    if status_file.signal is not None and status_file.ended_at and status_file.started_at:
        elapsed = (status_file.ended_at - status_file.started_at).total_seconds()
        signal_text = f"SIG{status_file.signal}"
        raw_state = f"EXIT_FILE signal={status_file.signal}"
        if status_file.time_limit_s > 0 and elapsed >= status_file.time_limit_s:
            return JobState.TIMEOUT, raw_state, 143, f"terminated by {signal_text} at its time limit"
        reason = (
            f"terminated by {signal_text} before its time limit (scancel or preemption; without Slurm "
            "accounting clusterx cannot tell which)"
        )
        return JobState.CANCELLED, raw_state, 143, reason
    reason = (
        "the job started but Slurm no longer knows it and its script never recorded an end "
        "(killed with SIGKILL, or its node was lost)"
    )
    return JobState.LOST, "EXIT_FILE started", None, reason


# squeue's reason (%r) of a job Slurm is ending from outside → the canonical state.
_ENDING_REASONS = {
    "TimeLimit": (JobState.TIMEOUT, "killed at its time limit"),
    "Deadline": (JobState.TIMEOUT, "killed at its deadline"),
    "Preempted": (JobState.PREEMPTED, "preempted by a job of higher priority"),
    "NodeDown": (JobState.NODE_FAIL, "a node of the job failed"),
    "NodeFail": (JobState.NODE_FAIL, "a node of the job failed"),
}


def _ended_by_slurm(status_file: StatusFile) -> tuple[JobState, str | None] | None:
    """(state, reason) when the script saw Slurm ending its job from outside (scancel, time limit, ...).

    A job whose processes end by themselves is still RUNNING in Slurm while its script writes the file;
    Slurm marks a job it ends COMPLETING (or CANCELLED, TIMEOUT, ...) before it signals the script.
    """
    word = normalize_state(status_file.slurm_state) if status_file.slurm_state else ""
    mapped = map_slurm_state(word) if word else None
    if mapped is not None and mapped.state.is_terminal and mapped.state is not JobState.SUCCEEDED:
        return combine(mapped, ExitStatus(None, None))
    if word != "COMPLETING":
        return None
    for prefix, outcome in _ENDING_REASONS.items():
        if status_file.slurm_reason.startswith(prefix):
            return outcome
    return JobState.CANCELLED, "cancelled (Slurm was ending the job when its script stopped)"


def _exit_from_file(status_file: StatusFile) -> ExitStatus:
    code = status_file.exit_code
    if code is None:
        return ExitStatus(None, None)
    if code > 128:  # srun reports a task killed by signal N as 128+N, like the shell
        return ExitStatus(code, f"killed by signal {code - 128} ({signal_name(code - 128)})")
    return ExitStatus(code, None if code == 0 else f"exited with status {code}")
