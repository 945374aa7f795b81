"""clusterx under load: submit latency (Python API), a whole `clusterx submit` command, `list` with 100,000 jobs
in the database, and one scheduling pass over 10,000 queued jobs. All on SQLite files in a temporary folder.

    .venv/bin/python tools/bench/clusterx_load.py [--jobs 100000] [--queued 10000] [--submits 300]

Targets: submit p50 <= 20 ms, CLI submit <= 250 ms, list <= 50 ms, scheduling pass <= 100 ms. The machine may be
shared: the baseline lines (an empty interpreter, `clusterx --help`) are measured in the same run so that the CLI
figure can be read as a ratio. The last line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from clusterx import Client, JobSpec
from clusterx.daemon.control import start_daemon, stop_daemon
from clusterx.daemon.resources import machine_capacity
from clusterx.daemon.scheduler import choose_jobs
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


def bench_sched_pass(folder: Path, queued: int) -> tuple[float, float]:
    """One pass as the daemon runs it: read the queue in order, choose what fits (without starting processes).
    Returns (a pass with this machine's free capacity, a pass that must read the whole queue)."""
    client = Client(str(folder / "sched.db"), runs_dir=folder / "runs")
    host = socket.gethostname()
    insert_bulk(client, bulk_jobs(queued, JobState.QUEUED, host))

    def timed(capacity: Capacity) -> float:
        times = []
        for _ in range(11):
            start = time.perf_counter()
            with contextlib.closing(client.store.queued("local", host, fits=capacity)) as queue:
                chosen = choose_jobs(queue, capacity)
            times.append((time.perf_counter() - start) * 1000)
            assert chosen
        return statistics.median(times[1:])

    # Room for everything: no early stop, every queued row is read and chosen.
    unbounded = Capacity(cpus=10**9, mem_mib=10**12, gpus=10**6)
    return timed(machine_capacity()), timed(unbounded)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs in the database for the list benchmark")
    parser.add_argument("--queued", type=int, default=10_000, help="queued jobs for the scheduling pass")
    parser.add_argument("--submits", type=int, default=300, help="submissions timed through the Python API")
    parser.add_argument("--cli-runs", type=int, default=10, help="timed runs of each command")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="clusterx-bench-") as tmp:
        folder = Path(tmp)
        p50, p99 = bench_submit(folder, args.submits)
        print(f"submit (Python API, SQLite): p50 {p50:.1f} ms, p99 {p99:.1f} ms over {args.submits}")
        cli = bench_cli(folder, args.cli_runs)
        print(
            f"whole commands: python -c pass {cli['python_startup_ms']:.0f} ms, clusterx --help "
            f"{cli['cli_help_ms']:.0f} ms, clusterx submit {cli['cli_submit_ms']:.0f} ms (daemon running)"
        )
        list_ms = bench_list(folder, args.jobs)
        print(f"list newest 50 of {args.jobs} jobs: {list_ms:.1f} ms")
        sched_ms, sched_full_ms = bench_sched_pass(folder, args.queued)
        print(
            f"scheduling pass over {args.queued} queued jobs: {sched_ms:.1f} ms with this machine's capacity, "
            f"{sched_full_ms:.1f} ms when every job fits (the whole queue read)"
        )
    figures = {
        "submit_p50_ms": round(p50, 2),
        "submit_p99_ms": round(p99, 2),
        "cli_submit_ms": round(cli["cli_submit_ms"], 1),
        "list_ms": round(list_ms, 2),
        "sched_pass_ms": round(sched_ms, 2),
        "sched_pass_whole_queue_ms": round(sched_full_ms, 2),
        "python_startup_ms": round(cli["python_startup_ms"], 1),
        "cli_help_ms": round(cli["cli_help_ms"], 1),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
