"""clusterx under load: submit latency (Python API), a whole `clusterx submit` command, `list` with 100,000 jobs
in the database, and one scheduling pass over 10,000 queued jobs. All on SQLite files in a temporary folder.

    .venv/bin/python tools/bench/clusterx_load.py [--jobs 100000] [--queued 10000] [--submits 300] [--only sched]
        [--busy 2] [--passes 10]

Targets: submit p50 <= 20 ms, CLI submit <= 250 ms, list <= 50 ms, scheduling pass <= 100 ms wall (each case,
with the machine loaded: the scheduling part starts `--busy` processes that spin on a core each beside it, and
stops them after). Each case's figure is the median of `--passes` passes (after one warm-up), with the passes'
min and max as its spread. The machine may be shared: the baseline lines (an empty interpreter, `clusterx --help`)
are measured in the same run so that the CLI figure can be read as a ratio. A default run takes 2-4 minutes on the
2-core development VM. The last line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from clusterx import Client, JobSpec
from clusterx.daemon.control import start_daemon, stop_daemon
from clusterx.daemon.resources import machine_capacity
from clusterx.daemon.scheduler import RunningJob, choose_jobs
from clusterx.db.models import Job, utcnow
from clusterx.states import JobState
from clusterx.store import Capacity


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def bench_submit(folder: Path, count: int) -> tuple[float, float]:
    """Client.submit on the local backend without a daemon (jobs stay queued, nothing runs meanwhile)."""
    client = Client(str(folder / "submit.db"), runs_dir=folder / "runs")
    spec = JobSpec(command=["true"], backend_options={"autostart": "false"})
    client.submit(spec.model_copy(update={"submit_key": "warm-up"}))
    times = []
    for i in range(count):
        one = spec.model_copy(update={"submit_key": f"bench-{i}"})
        start = time.perf_counter()
        client.submit(one)
        times.append((time.perf_counter() - start) * 1000)
    client.close()
    return percentile(times, 50), percentile(times, 99)


def bench_cli(folder: Path, runs: int) -> dict[str, float]:
    """Wall time of whole commands, interpreter start included, with bytecode caching as an install has it."""
    db = str(folder / "cli.db")
    env = {**os.environ, "CLUSTERX_DB": db, "CLUSTERX_RUNS_DIR": str(folder / "runs"), "CLUSTERX_DAEMON_CPUS": "0"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # this sandbox sets it; installed packages have their .pyc files
    env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
    exe = Path(sys.executable).parent / "clusterx"
    Client(db).close()  # create the database
    os.environ["CLUSTERX_DAEMON_CPUS"] = "0"  # the daemon inherits it
    start_daemon(f"sqlite:///{Path(db).resolve()}")  # CPUS=0: it accepts submissions and runs nothing

    def wall(argv: list[str]) -> float:
        times = []
        for _ in range(runs + 1):
            start = time.perf_counter()
            subprocess.run(argv, env=env, check=True, capture_output=True, timeout=120)
            times.append((time.perf_counter() - start) * 1000)
        return statistics.median(times[1:])  # the first run fills the bytecode cache

    try:
        return {
            "python_startup_ms": wall([sys.executable, "-c", "pass"]),
            "cli_help_ms": wall([str(exe), "--help"]),
            "cli_submit_ms": wall([str(exe), "submit", "--", "true"]),
        }
    finally:
        stop_daemon(f"sqlite:///{Path(db).resolve()}")


def bulk_jobs(count: int, state: JobState, host: str) -> list[dict[str, Any]]:
    now = utcnow()
    spec = JobSpec(command=["python", "train.py"], workdir="/work", run_dir="/runs/x").model_dump(mode="json")
    return [
        {
            "submit_key": f"bulk-{state.value}-{i}",
            "name": f"job-{i % 97}",
            "user": "bench",
            "submit_host": host,
            "backend": "local",
            "state": state.value,
            "spec": spec,
            "run_dir": "/runs/x",
            "log_paths": {},
            "hosts": [],
            "rank_to_host": {},
            "attempt": 1,
            "max_retries": 0,
            "priority": i % 5,
            "nodes": 1,
            "cpus": 1 + i % 4,
            "gpus": 0,
            "mem_mib": 1024,
            "time_limit_s": None if i % 3 == 0 else 600 + i % 3600,
            "cancel_requested": False,
            "created_at": now,
            "updated_at": now,
        }
        for i in range(count)
    ]


def insert_bulk(client: Client, rows: list[dict[str, Any]]) -> None:
    from sqlalchemy import insert

    with client.store.engine.begin() as connection:
        for start in range(0, len(rows), 10_000):
            connection.execute(insert(Job), rows[start : start + 10_000])


def bench_list(folder: Path, jobs: int) -> float:
    client = Client(str(folder / "list.db"), runs_dir=folder / "runs", poll_interval_s=0)
    ended = bulk_jobs(jobs, JobState.SUCCEEDED, socket.gethostname())
    insert_bulk(client, ended)
    times = []
    for _ in range(21):
        start = time.perf_counter()
        newest = client.list(limit=50)  # with its reconcile query, as `clusterx list` runs it
        times.append((time.perf_counter() - start) * 1000)
        assert len(newest) == 50
    return statistics.median(times[1:])


@contextlib.contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """`count` processes that each keep one core busy for as long as the block runs."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5 if count else 0)  # let them reach their loop
        yield
    finally:
        for process in spinning:
            process.kill()
            process.wait()


def bench_sched_pass(folder: Path, queued: int, passes: int = 10) -> dict[str, float]:
    """One pass as the daemon runs it: read the queue in order, choose what starts (EASY backfill), without
    starting processes. Three cases:
    - this machine's capacity, nothing running: the pass stops once no core is left;
    - room for every job: no early stop, every queued row is read and chosen;
    - backfill around a reservation: the highest-priority job needs a GPU that 64 running jobs with time limits
      hold, so it gets a reservation, and every other job is read and checked against it (the most work a pass
      does per job)."""
    client = Client(str(folder / "sched.db"), runs_dir=folder / "runs")
    host = socket.gethostname()
    rows = bulk_jobs(queued, JobState.QUEUED, host)
    rows[0].update(priority=100, gpus=1)  # the head of the third case
    insert_bulk(client, rows)

    def timed(capacity: Capacity, running: list[RunningJob], expect_reservation: bool) -> dict[str, float]:
        """Wall milliseconds of `passes` passes (after one warm-up): median, min, max; and the median CPU time,
        which other processes on a loaded machine disturb least."""
        walls, cpus = [], []
        for _ in range(passes + 1):
            start, start_cpu = time.perf_counter(), time.process_time()
            with contextlib.closing(client.store.queued("local", host)) as queue:
                chosen, reservation = choose_jobs(queue, capacity, running, time.time())
            walls.append((time.perf_counter() - start) * 1000)
            cpus.append((time.process_time() - start_cpu) * 1000)
            assert chosen and (reservation is not None) == expect_reservation
        walls = walls[1:]
        return {"": statistics.median(walls), "_min": min(walls), "_max": max(walls),
                "_cpu": statistics.median(cpus[1:])}  # fmt: skip

    def raw_read() -> float:
        """The floor: the same rows through the sqlite3 module alone (no SQLAlchemy, no scheduling)."""
        sql = (
            "SELECT id, priority, cpus, gpus, mem_mib, time_limit_s FROM jobs WHERE state = 'QUEUED' AND backend = "
            "'local' AND cancel_requested = 0 AND submit_host = ? ORDER BY priority DESC, id"
        )
        times = []
        with contextlib.closing(sqlite3.connect(folder / "sched.db")) as connection:
            for _ in range(11):
                start = time.perf_counter()
                assert len(connection.execute(sql, (host,)).fetchall()) == queued
                times.append((time.perf_counter() - start) * 1000)
        return statistics.median(times[1:])

    machine = machine_capacity()
    unbounded = Capacity(cpus=10**9, mem_mib=10**12, gpus=10**6)
    gpu_holders = [RunningJob(time.time() + 600 + i, 1, 1024, 1) for i in range(64)]
    figures: dict[str, float] = {}
    for case, capacity, running, reserves in (
        ("machine", Capacity(machine.cpus, machine.mem_mib, 0), [], True),
        ("whole_queue", unbounded, [], False),
        ("backfill", Capacity(10**9, 10**12, 0), gpu_holders, True),
    ):
        for suffix, value in timed(capacity, running, expect_reservation=reserves).items():
            figures[case + suffix] = value
    figures["raw_read"] = raw_read()
    return figures


def _spread(figures: dict[str, float], case: str) -> str:
    return f"{figures[case]:.1f} ms ({figures[case + '_min']:.1f}-{figures[case + '_max']:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs in the database for the list benchmark")
    parser.add_argument("--queued", type=int, default=10_000, help="queued jobs for the scheduling pass")
    parser.add_argument("--submits", type=int, default=300, help="submissions timed through the Python API")
    parser.add_argument("--cli-runs", type=int, default=10, help="timed runs of each command")
    parser.add_argument("--only", choices=["submit", "cli", "list", "sched"], help="run one part")
    parser.add_argument("--busy", type=int, default=2, help="processes spinning beside the scheduling part")
    parser.add_argument("--passes", type=int, default=10, help="timed passes per scheduling case")
    args = parser.parse_args()
    wall_began = time.perf_counter()
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="clusterx-bench-") as tmp:
        folder = Path(tmp)
        if args.only in (None, "submit"):
            p50, p99 = bench_submit(folder, args.submits)
            print(f"submit (Python API, SQLite): p50 {p50:.1f} ms, p99 {p99:.1f} ms over {args.submits}")
            figures.update(submit_p50_ms=round(p50, 2), submit_p99_ms=round(p99, 2))
        if args.only in (None, "cli"):
            cli = bench_cli(folder, args.cli_runs)
            print(
                f"whole commands: python -c pass {cli['python_startup_ms']:.0f} ms, clusterx --help "
                f"{cli['cli_help_ms']:.0f} ms, clusterx submit {cli['cli_submit_ms']:.0f} ms (daemon running)"
            )
            figures.update(
                cli_submit_ms=round(cli["cli_submit_ms"], 1),
                python_startup_ms=round(cli["python_startup_ms"], 1),
                cli_help_ms=round(cli["cli_help_ms"], 1),
            )
        if args.only in (None, "list"):
            list_ms = bench_list(folder, args.jobs)
            print(f"list newest 50 of {args.jobs} jobs: {list_ms:.1f} ms")
            figures["list_ms"] = round(list_ms, 2)
        if args.only in (None, "sched"):
            with busy_processes(args.busy):
                sched = bench_sched_pass(folder, args.queued, args.passes)
                load = os.getloadavg()[0]
            print(
                f"scheduling pass over {args.queued} queued jobs, {args.busy} busy processes beside it (median, "
                f"min-max of {args.passes} passes): {_spread(sched, 'machine')} with this machine's capacity, "
                f"{_spread(sched, 'whole_queue')} when every job fits (the whole queue read), "
                f"{_spread(sched, 'backfill')} backfilling every job around a reservation; reading the rows with "
                f"sqlite3 alone: {sched['raw_read']:.1f} ms"
            )
            for case, name in (("machine", "sched_pass"), ("whole_queue", "sched_pass_whole_queue"),
                               ("backfill", "sched_pass_backfill")):  # fmt: skip
                figures.update({
                    f"{name}_ms": round(sched[case], 2),
                    f"{name}_min_ms": round(sched[f"{case}_min"], 2),
                    f"{name}_max_ms": round(sched[f"{case}_max"], 2),
                    f"{name}_cpu_ms": round(sched[f"{case}_cpu"], 2),
                })  # fmt: skip
            figures.update(sched_raw_read_ms=round(sched["raw_read"], 2), busy_processes=args.busy,
                           load_avg_1m_during_sched=round(load, 2))  # fmt: skip
    figures["load_avg_1m"] = round(os.getloadavg()[0], 2)
    figures["wall_s"] = round(time.perf_counter() - wall_began, 1)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
