"""EASY backfill as a pure function, on planted workloads: the blocked head gets a reservation from the running
jobs' time limits, and a job behind it starts only when it cannot delay that reservation."""

from __future__ import annotations

from clusterx.daemon.scheduler import NEVER, RunningJob, choose_jobs
from clusterx.store import Capacity, QueuedJob

NOW = 1000.0
TWO_CPUS = Capacity(cpus=2, mem_mib=8000, gpus=0)


def job(job_id: int, cpus: int = 1, limit: int | None = 60, priority: int = 0, gpus: int = 0) -> QueuedJob:
    return QueuedJob(id=job_id, priority=priority, cpus=cpus, gpus=gpus, mem_mib=100, time_limit_s=limit)


def ids(queued: list[QueuedJob]) -> list[int]:
    return [j.id for j in queued]


def test_a_wide_job_is_not_overtaken_by_a_stream_of_narrow_ones() -> None:
    # One of two cores busy until NOW+30; the 2-core job waits for it. A 1-core job with a 60 s limit would hold
    # the other core past NOW+30 and push the wide job back: without a reservation it would start (and the next
    # one after it, and so on: starvation).
    running = [RunningJob(ends_at=NOW + 30, cpus=1, mem_mib=100, gpus=0)]
    free = Capacity(cpus=1, mem_mib=7900, gpus=0)
    chosen, reservation = choose_jobs([job(1, cpus=2), job(2), job(3)], free, running, NOW, TWO_CPUS)
    assert chosen == []
    assert reservation is not None
    assert (reservation.job_id, reservation.start) == (1, NOW + 30)
    assert reservation.spare == Capacity(cpus=0, mem_mib=7900, gpus=0)


def test_a_job_that_ends_before_the_reservation_backfills() -> None:
    running = [RunningJob(ends_at=NOW + 30, cpus=1, mem_mib=100, gpus=0)]
    free = Capacity(cpus=1, mem_mib=7900, gpus=0)
    queue = [job(1, cpus=2), job(2, limit=60), job(3, limit=20), job(4, limit=10)]
    chosen, reservation = choose_jobs(queue, free, running, NOW, TWO_CPUS)
    assert ids(chosen) == [3]  # ends at NOW+20 < NOW+30; job 4 would too, but the core is taken by then
    assert reservation is not None and reservation.start == NOW + 30


def test_spare_resources_at_the_reservation_take_jobs_that_outlast_it() -> None:
    # Four cores: two busy until NOW+30, the head needs three. At NOW+30 one core is spare: one job of any length
    # (also one without a time limit) may take it now; a second one may not.
    four = Capacity(cpus=4, mem_mib=8000, gpus=0)
    running = [RunningJob(ends_at=NOW + 30, cpus=2, mem_mib=200, gpus=0)]
    free = Capacity(cpus=2, mem_mib=7800, gpus=0)
    chosen, reservation = choose_jobs([job(1, cpus=3), job(2, limit=None), job(3, limit=500)], free, running, NOW, four)
    assert ids(chosen) == [2]
    assert reservation is not None and reservation.spare.cpus == 1  # the spare core job 2 took (job 3 found none)


def test_the_reservation_counts_jobs_started_in_the_same_pass() -> None:
    # Job 1 takes a core now (60 s limit); job 2 then needs both: it waits for job 1, so job 3 (100 s) must not
    # start, while job 4 (50 s) ends before job 1 does.
    chosen, reservation = choose_jobs([job(1), job(2, cpus=2), job(3, limit=100), job(4, limit=50)], TWO_CPUS, (), NOW)
    assert ids(chosen) == [1, 4]
    assert reservation is not None and (reservation.job_id, reservation.start) == (2, NOW + 60)


def test_running_jobs_without_a_time_limit_never_free_their_share() -> None:
    # The head's cores are held by a job that may run forever: its reservation has no time. Timed jobs that fit
    # start; an untimed one would hold what the head needs at whatever time it becomes possible: it waits.
    running = [RunningJob(ends_at=NEVER, cpus=1, mem_mib=100, gpus=0)]
    free = Capacity(cpus=1, mem_mib=7900, gpus=0)
    chosen, reservation = choose_jobs(
        [job(1, cpus=2), job(2, limit=None), job(3, limit=5)], free, running, NOW, TWO_CPUS
    )
    assert ids(chosen) == [3]
    assert reservation is not None and reservation.start == NEVER


def test_priority_then_submission_order_and_other_resources() -> None:
    queue = [
        job(2, cpus=2, priority=5, gpus=1),
        job(3, cpus=2, priority=5, gpus=1),  # no GPU left after job 2: the head, reserved at job 2's end
        job(4, limit=30),  # ends before job 2 does
        job(5, limit=None),  # outlasts the reservation, on one of the two cores the head leaves spare
        job(6, limit=None, gpus=1),  # no GPU free now (and it is the head's at its start)
    ]
    chosen, reservation = choose_jobs(queue, Capacity(cpus=8, mem_mib=4000, gpus=1), (), NOW)
    assert ids(chosen) == [2, 4, 5]
    assert reservation is not None and reservation.job_id == 3


def test_a_job_larger_than_the_machine_reserves_nothing() -> None:
    # Possible when CLUSTERX_DAEMON_CPUS offers fewer cores than the machine has: it can never start here, so it
    # must not hold everyone else back.
    chosen, reservation = choose_jobs([job(1, cpus=8), job(2, limit=None)], TWO_CPUS, (), NOW, TWO_CPUS)
    assert ids(chosen) == [2] and reservation is None


def test_everything_that_fits_starts_without_a_reservation() -> None:
    chosen, reservation = choose_jobs([job(i) for i in range(5)], TWO_CPUS, (), NOW)
    assert ids(chosen) == [0, 1] and reservation is None  # no job was blocked by resources, only by the cores
