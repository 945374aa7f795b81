"""The daemon's loop: start queued jobs that fit, watch running ones, enforce time limits and cancellations,
retry failed attempts, and — at start — reconcile the jobs a previous daemon was running.

It survives its own crash because everything it needs is outside its memory: the job and attempt rows (pid,
process group, process start time, GPUs), and the exit-status file each attempt's wrapper writes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen

import psutil

from clusterx.backends.local import LocalBackend
from clusterx.daemon import wrapper
from clusterx.daemon.launch import launch, same_process_alive
from clusterx.daemon.outcome import KillReason, outcome, read_exit_file
from clusterx.daemon.resources import Capacity
from clusterx.daemon.scheduler import NEVER, RunningJob, choose_jobs
from clusterx.db.engine import sqlite_path
from clusterx.db.models import Job, utcnow
from clusterx.paths import attempt_dir
from clusterx.spec import JobSpec
from clusterx.states import JobState
from clusterx.store import JobStore

log = logging.getLogger("clusterx.daemon")
SOURCE = "daemon"


@dataclass
class Tracked:
    """A running attempt this daemon watches (started by it, or adopted from a previous daemon)."""

    job_id: int
    attempt: int
    pid: int
    proc_start_time: float
    process: Popen[bytes] | None  # None when adopted: not our child, watched through its pid
    cpus: int
    mem_mib: int
    gpu_ids: list[int]
    started_wall: float
    time_limit_s: int | None
    max_retries: int
    directory: Path
    kill_reason: KillReason | None = None
    kill_sent_at: float | None = None
    killed_hard: bool = False
    adopted: bool = field(default=False)


class Daemon:
    def __init__(
        self,
        store: JobStore,
        capacity: Capacity,
        gpu_ids: list[int],
        *,
        host: str | None = None,
        tick_s: float = 0.2,
        idle_exit_s: float | None = None,
        kill_grace_s: float = 5.0,
    ) -> None:
        self.store = store
        self.capacity = capacity
        self.all_gpu_ids = gpu_ids
        self.host = host or socket.gethostname()
        self.tick_s = tick_s
        self.idle_exit_s = idle_exit_s
        self.kill_grace_s = kill_grace_s
        self.tracked: dict[int, Tracked] = {}
        self.stopping = False
        self._last_busy = time.monotonic()
        self._db_file = sqlite_path(store.url)
        self._last_reserved: int | None = None  # the job holding the reservation: logged when it changes

    # -- main loop ----------------------------------------------------------------------------------------------
    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._request_stop)
        signal.signal(signal.SIGINT, self._request_stop)
        self.reconcile()
        while not self.stopping:
            try:
                self.tick()
            except Exception:  # a database hiccup must not end the daemon: its jobs need watching
                log.exception("tick failed; trying again in 1 s")
                time.sleep(1.0)
            time.sleep(self.tick_s)
        log.info("stopping; %d running job(s) keep running and are adopted by the next daemon", len(self.tracked))

    def _request_stop(self, _signum: int, _frame: object) -> None:
        self.stopping = True

    def tick(self) -> None:
        self.check_finished()
        self.check_cancels()
        self.check_time_limits()
        started = self.schedule()
        now = time.monotonic()
        if self.tracked or started:
            self._last_busy = now
        if self.idle_exit_s is not None and now - self._last_busy > self.idle_exit_s:
            log.info("idle for %.0f s: exiting", self.idle_exit_s)
            self.stopping = True
        if self._db_file is not None and not self._db_file.exists():
            log.info("database %s is gone: exiting", self._db_file)
            self.stopping = True

    # -- scheduling ---------------------------------------------------------------------------------------------
    def free_capacity(self) -> Capacity:
        free = self.capacity
        for t in self.tracked.values():
            free = free.minus(t.cpus, t.mem_mib, len(t.gpu_ids))
        return free

    def running_jobs(self) -> list[RunningJob]:
        """The plan's view of what runs: each job until its time limit (for ever without one)."""
        return [
            RunningJob(t.started_wall + t.time_limit_s if t.time_limit_s else NEVER, t.cpus, t.mem_mib, len(t.gpu_ids))
            for t in self.tracked.values()
        ]

    def schedule(self) -> int:
        """One scheduling pass (EASY backfill, clusterx.daemon.scheduler); returns how many jobs it started."""
        free = self.free_capacity()
        if free.cpus <= 0:
            return 0
        started = 0
        with contextlib.closing(self.store.queued(LocalBackend.name, self.host)) as queue:
            chosen, reservation = choose_jobs(queue, free, self.running_jobs(), time.time(), total=self.capacity)
        if reservation is not None and reservation.job_id != self._last_reserved:
            when = (
                "never (held by jobs without a time limit)"
                if reservation.start == NEVER
                else (f"in {max(0.0, reservation.start - time.time()):.0f} s")
            )
            log.info("job %d waits for resources: reserved to start %s", reservation.job_id, when)
        self._last_reserved = reservation.job_id if reservation else None
        for queued in chosen:
            if self.store.claim(queued.id, SOURCE):
                self.start(queued.id)
                started += 1
        return started

    def start(self, job_id: int) -> None:
        job = self.store.get(job_id)
        spec = JobSpec.model_validate(job.spec)
        used = {g for t in self.tracked.values() for g in t.gpu_ids}
        gpu_ids = [g for g in self.all_gpu_ids if g not in used][: job.gpus]
        directory = attempt_dir(job.run_dir, job.attempt)
        try:
            launched = launch(spec, job.id, job.attempt, job.run_dir, gpu_ids)
        except OSError as exc:
            reason = f"could not start: {exc}"
            log.warning("job %d: %s", job.id, reason)
            self.store.apply(
                job.id, SOURCE, reason, JobState.FAILED,
                fields={"failure_reason": reason, "raw_state": "LAUNCH_FAILED"},
                attempt_fields={"state": JobState.FAILED, "reason": reason, "ended_at": utcnow()},
            )  # fmt: skip
            return
        now = utcnow()
        ranks = {str(rank): self.host for rank in range(spec.world_size)}
        self.store.apply(
            job.id,
            SOURCE,
            f"attempt {job.attempt} started as pid {launched.pid}",
            JobState.RUNNING,
            fields={
                "hosts": [self.host],
                "rank_to_host": ranks,
                "raw_state": "RUNNING",
                "log_paths": {"stdout": str(directory / "stdout.log"), "stderr": str(directory / "stderr.log")},
            },
            attempt_fields={
                "state": JobState.RUNNING,
                "backend_job_id": job.backend_job_id,
                "host": self.host,
                "pid": launched.pid,
                "pgid": launched.pgid,
                "proc_start_time": launched.proc_start_time,
                "gpu_ids": ",".join(map(str, gpu_ids)),
                "log_dir": str(directory),
                "started_at": now,
            },
        )
        self.tracked[job.id] = Tracked(
            job_id=job.id,
            attempt=job.attempt,
            pid=launched.pid,
            proc_start_time=launched.proc_start_time,
            process=launched.process,
            cpus=job.cpus,
            mem_mib=job.mem_mib,
            gpu_ids=gpu_ids,
            started_wall=now.timestamp(),
            time_limit_s=job.time_limit_s,
            max_retries=job.max_retries,
            directory=directory,
        )
        log.info("job %d attempt %d started: pid %d", job.id, job.attempt, launched.pid)

    # -- watching -----------------------------------------------------------------------------------------------
    def check_finished(self) -> None:
        for t in list(self.tracked.values()):
            if t.process is not None:
                own_status = t.process.poll()
                if own_status is None:
                    continue
            else:
                if same_process_alive(t.pid, t.proc_start_time):
                    continue
                own_status = None
            recorded = read_exit_file(t.directory)
            returncode = recorded[0] if recorded is not None else own_status
            self.finish(t, returncode, recorded[1] if recorded else None)

    def finish(self, t: Tracked, returncode: int | None, wrapper_reason: str | None) -> None:
        self.tracked.pop(t.job_id, None)
        result = outcome(returncode, t.kill_reason, t.time_limit_s)
        reason = wrapper_reason or result.reason
        ended = utcnow()
        attempt_fields = {
            "state": result.state,
            "exit_code": result.exit_code,
            "reason": reason,
            "ended_at": ended,
        }
        if result.state == JobState.FAILED and t.attempt <= t.max_retries:
            message = (
                f"attempt {t.attempt} failed ({reason}); retrying as attempt {t.attempt + 1} of {t.max_retries + 1}"
            )
            self.store.requeue_for_retry(t.job_id, t.attempt, SOURCE, message, attempt_fields)
            log.info("job %d: %s", t.job_id, message)
            return
        self.store.apply(
            t.job_id,
            SOURCE,
            reason or f"attempt {t.attempt} succeeded",
            result.state,
            fields={"exit_code": result.exit_code, "failure_reason": reason, "raw_state": result.raw_state},
            expect_attempt=t.attempt,
            attempt_fields=attempt_fields,
        )
        log.info("job %d ended %s (%s)", t.job_id, result.state.value, reason or "exit 0")

    def check_cancels(self) -> None:
        if not self.tracked:
            return
        for job_id in self.store.cancel_requested_among(list(self.tracked)):
            t = self.tracked[job_id]
            if t.kill_reason is None:
                self.kill(t, "cancel")

    def check_time_limits(self) -> None:
        now_wall = time.time()
        now = time.monotonic()
        for t in self.tracked.values():
            if t.kill_reason is None and t.time_limit_s is not None and now_wall - t.started_wall > t.time_limit_s:
                self.kill(t, "timeout")
            elif t.kill_sent_at is not None and not t.killed_hard and now - t.kill_sent_at > self.kill_grace_s:
                self._signal_group(t, signal.SIGKILL)
                t.killed_hard = True

    def kill(self, t: Tracked, reason: KillReason) -> None:
        """SIGTERM to the whole process group now, SIGKILL after the grace period."""
        log.info("job %d: %s: terminating process group %d", t.job_id, reason, t.pid)
        t.kill_reason = reason
        t.kill_sent_at = time.monotonic()
        self._signal_group(t, signal.SIGTERM)

    def _signal_group(self, t: Tracked, sig: signal.Signals) -> None:
        if t.process is None and not same_process_alive(t.pid, t.proc_start_time):
            return  # never signal a group whose leader might be another process by now
        with contextlib.suppress(ProcessLookupError):
            os.killpg(t.pid, sig)

    # -- after a restart ----------------------------------------------------------------------------------------
    def reconcile(self) -> None:
        """Account for every job a previous daemon was running: adopt it, record its end, or mark it LOST."""
        for job in self.store.live_jobs([LocalBackend.name]):
            if job.submit_host != self.host or job.state not in (JobState.STARTING, JobState.RUNNING):
                continue
            self._reconcile_one(job)

    def _reconcile_one(self, job: Job) -> None:
        row = self.store.attempt(job.id, job.attempt)
        directory = Path(row.log_dir) if row and row.log_dir else attempt_dir(job.run_dir, job.attempt)
        pid = row.pid if row else None
        start_time = row.proc_start_time if row else None
        if pid is None:
            # The daemon died between claiming the job and recording its process: the wrapper's own pid file
            # says whether it ever started.
            started = _read_wrapper_pid(directory)
            if started is None and read_exit_file(directory) is None:
                self.store.unclaim(job.id, SOURCE, "the previous daemon stopped before starting it; queued again")
                return
            if started is not None:
                pid, start_time = started
        gpu_ids = [int(g) for g in row.gpu_ids.split(",") if g] if row and row.gpu_ids else []
        started_wall = row.started_at.timestamp() if row and row.started_at else time.time()
        t = Tracked(
            job_id=job.id,
            attempt=job.attempt,
            pid=pid or -1,
            proc_start_time=start_time or 0.0,
            process=None,
            cpus=job.cpus,
            mem_mib=job.mem_mib,
            gpu_ids=gpu_ids,
            started_wall=started_wall,
            time_limit_s=job.time_limit_s,
            max_retries=job.max_retries,
            directory=directory,
            adopted=True,
        )
        if pid is not None and start_time is not None and same_process_alive(pid, start_time):
            # A cancel asked for meanwhile is carried out by the next check_cancels.
            self.tracked[job.id] = t
            self.store.note(job.id, SOURCE, f"adopted running pid {pid} after a daemon restart")
            log.info("job %d: adopted pid %d", job.id, pid)
            return
        if job.cancel_requested:
            t.kill_reason = "cancel"  # it ended after its user asked for the cancel: CANCELLED
        recorded = read_exit_file(directory)
        if recorded is None and t.kill_reason is None:
            reason = (
                f"process {pid} ended while the daemon was down and left no exit status"
                if pid is not None
                else "no process and no exit status found after a daemon restart"
            )
            self.store.apply(
                job.id, SOURCE, reason, JobState.LOST, fields={"failure_reason": reason, "raw_state": "LOST"},
                attempt_fields={"state": JobState.LOST, "reason": reason, "ended_at": utcnow()},
            )  # fmt: skip
            return
        self.finish(t, recorded[0] if recorded else None, recorded[1] if recorded else None)


def _read_wrapper_pid(directory: Path) -> tuple[int, float] | None:
    """(pid, process start time) from the wrapper's own pid file; start time 0 when that pid is gone or now
    names a different process."""
    try:
        data = json.loads((directory / wrapper.PID_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    pid = int(data["pid"])
    try:
        create_time = psutil.Process(pid).create_time()
    except psutil.Error:
        return pid, 0.0
    # The wrapper wrote the file right after it started; a reused pid was created at another time.
    return (pid, create_time) if abs(create_time - float(data["started"])) < 2.0 else (pid, 0.0)
