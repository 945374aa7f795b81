"""One scheduling pass, as a pure function: which queued jobs start now.

Jobs are considered in priority order, then submission order; each one that fits the resources still free
starts, and a job that does not fit does not block smaller ones behind it (backfill). The price of that simple
backfill is that a large job can wait while small ones keep arriving; priorities are the user's lever.
"""

from __future__ import annotations

from collections.abc import Iterable

from clusterx.daemon.resources import Capacity
from clusterx.store import QueuedJob


def choose_jobs(queued: Iterable[QueuedJob], free: Capacity) -> list[QueuedJob]:
    """The jobs to start, in the order given (the caller orders by priority, then id). Stops reading the
    queue once no CPU core is left."""
    chosen = []
    for job in queued:
        if free.cpus <= 0 and job.cpus > 0:
            break  # nothing more can fit: stop early on a long queue
        if free.fits(job.cpus, job.mem_mib, job.gpus):
            chosen.append(job)
            free = free.minus(job.cpus, job.mem_mib, job.gpus)
    return chosen
