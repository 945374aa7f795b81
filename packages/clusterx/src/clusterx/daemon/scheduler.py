"""One scheduling pass, as a pure function: which queued jobs start now. EASY backfill (docs/clusterx.md,
"Scheduling"):

- Jobs are taken in priority order, then submission order; each one that fits the free resources starts.
- The first job that does not fit (the *head*) gets a reservation: the earliest time enough resources will be
  free for it, from the running jobs' time limits (a job started at t with limit L is planned to end at t + L).
- A job behind the head may start now (backfill) only if it cannot delay that reservation: it ends (by its own
  time limit) before the reservation's time, or it fits in what the head leaves spare at that time.
- No time limit means "may run forever": a running job without one never frees its resources in the plan, and a
  queued job without one backfills only into the head's spare resources. When the head's reservation cannot be
  placed at all (the resources it needs are held by jobs without time limits), it has no time, so jobs with a
  time limit that fit still start, and jobs without one start only if the head could not use their share even
  after every timed job ended.

A job larger than the whole machine (possible when CLUSTERX_DAEMON_CPUS offers fewer cores than exist) never
starts and reserves nothing. Only the head is protected (that is EASY's bargain: one reservation keeps the pass
linear). When it starts, the next blocked job becomes the head. No priority ageing: a job's place is its priority
and its submission order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from clusterx.store import Capacity, QueuedJob

NEVER = math.inf


@dataclass(frozen=True)
class RunningJob:
    """What the plan needs of a running job: when it will have ended at the latest, and what it holds."""

    ends_at: float  # wall-clock seconds; NEVER without a time limit
    cpus: int
    mem_mib: int
    gpus: int


@dataclass(frozen=True)
class Reservation:
    """The head's place: from `start` on, it may use the resources; `spare` is what it leaves of them then."""

    job_id: int
    start: float
    spare: Capacity


def reserve(head: QueuedJob, free: Capacity, running: Sequence[RunningJob], now: float) -> Reservation:
    """The earliest time `head` fits, walking the running jobs' ends in time order."""
    cpus, mem, gpus = free.cpus, free.mem_mib, free.gpus
    for job in sorted(running, key=lambda r: r.ends_at):
        if job.ends_at == NEVER:
            break
        cpus, mem, gpus = cpus + job.cpus, mem + job.mem_mib, gpus + job.gpus
        if head.cpus <= cpus and head.mem_mib <= mem and head.gpus <= gpus:
            return Reservation(
                head.id, max(now, job.ends_at), Capacity(cpus - head.cpus, mem - head.mem_mib, gpus - head.gpus)
            )
    # Not even when every timed job has ended: what it would leave then (negative where it cannot fit at all).
    return Reservation(head.id, NEVER, Capacity(cpus - head.cpus, mem - head.mem_mib, gpus - head.gpus))


def choose_jobs(
    queued: Iterable[QueuedJob],
    free: Capacity,
    running: Sequence[RunningJob] = (),
    now: float = 0.0,
    total: Capacity | None = None,
) -> tuple[list[QueuedJob], Reservation | None]:
    """The jobs to start, in the order given (the caller orders by priority, then id), and the head's
    reservation (None when nothing is blocked). Stops reading the queue once no CPU core is left (every job holds
    at least one). A job larger than `total` (the whole machine) can never start here: it is passed over and
    reserves nothing."""
    chosen: list[QueuedJob] = []
    # Plain integers and one unpacking per job: on a 10,000-job queue, objects or calls per job would cost more
    # than the pass itself.
    cpus, mem, gpus = free.cpus, free.mem_mib, free.gpus
    reservation: Reservation | None = None
    start = NEVER  # the reservation's time, once there is one
    spare_cpus = spare_mem = spare_gpus = 0
    for job in queued:
        if cpus <= 0:
            break
        _, _, job_cpus, job_gpus, job_mem, limit = job
        if job_cpus > cpus or job_mem > mem or job_gpus > gpus:
            if reservation is None and not (
                total is not None and (job_cpus > total.cpus or job_mem > total.mem_mib or job_gpus > total.gpus)
            ):
                # The head: planned against what runs now plus what this pass has started already.
                started = [RunningJob(_ends(j, now), j.cpus, j.mem_mib, j.gpus) for j in chosen]
                reservation = reserve(job, Capacity(cpus, mem, gpus), [*running, *started], now)
                start = reservation.start
                spare_cpus, spare_mem, spare_gpus = (
                    reservation.spare.cpus,
                    reservation.spare.mem_mib,
                    reservation.spare.gpus,
                )
            continue
        # Behind the head, a job still running at the head's start (or for ever) may hold only its spare share.
        if reservation is not None and (not limit or now + limit > start):
            if job_cpus > spare_cpus or job_mem > spare_mem or job_gpus > spare_gpus:
                continue
            spare_cpus, spare_mem, spare_gpus = spare_cpus - job_cpus, spare_mem - job_mem, spare_gpus - job_gpus
        chosen.append(job)
        cpus, mem, gpus = cpus - job_cpus, mem - job_mem, gpus - job_gpus
    return chosen, reservation


def _ends(job: QueuedJob, now: float) -> float:
    return now + job.time_limit_s if job.time_limit_s else NEVER
