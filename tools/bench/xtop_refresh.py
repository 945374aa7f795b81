"""xtop's costs: one refresh of a 10,000-job (or 100,000-job) table, following a metrics file, and start-up to
first paint.

    .venv/bin/python tools/bench/xtop_refresh.py [--jobs 10000] [--live 100] [--ticks 20] [--rounds 3]

- refresh_ms: the median wall time of one tick with the jobs screen showing (200x60, headless): the worker's look
  at the database (the jobs changed since the newest change seen), handing the result over, moving the changed
  jobs in the order, and drawing the lines that changed. Between ticks 5 live jobs end and 5 new ones arrive
  (written straight into the database, updated_at set, as the daemon writes them). `--rounds` rounds of
  `--ticks` ticks; the spread is the rounds' medians (min and max) and p90 is over every tick. Beside it, in the
  same run: reading every job once (what a tick would cost without the incremental cache), the database part of
  a tick alone (fetch_ms), and what waiting for a repaint costs when nothing changed (idle_repaint_wait_ms:
  Textual's frame timer and message loop). Targets: refresh_ms <= 50 and refresh_p90_ms <= 100 at 10,000 jobs,
  refresh_ms <= 100 at 100,000.
- tail_ms_per_1k_lines: the cost of one poll of the run directory after 1,000 new metrics lines, once after a
  short file (1,000 lines) and once after a long one (200,000 lines): following costs the new lines only when the
  two agree (their ratio is printed). Target: proportional to the new lines.
- startup_s: from starting `xtop` in a fresh tmux terminal to its first paint with the jobs table's rows (the
  screens' bar and a RUNNING job drawn), beside the bare `python -c "import textual.app"`, interleaved, 5 of each
  (medians; the spread is the pairs' ratios). startup_ratio = startup_s / import_textual_s; target <= 1.2.

The whole default run takes about a minute on the 2-core development VM; `--jobs 100000` a few minutes. The last
line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from clusterx import Client, JobSpec
from clusterx.db.models import Job, utcnow
from sqlalchemy import insert, update
from xtop.app import XtopApp
from xtop.jobs import JobFeed
from xtop.resources import ResourceSample
from xtop.run_source import RunSource

BIN = Path(sys.executable).parent


def job_rows(start: int, count: int, state: str) -> list[dict[str, Any]]:
    """Jobs as the store writes them; updated_at is each one's last change (an ended job's some time ago)."""
    now = utcnow()
    spec = JobSpec(command=["python", "train.py"], workdir="/work", run_dir="/runs/x").model_dump(mode="json")
    return [
        {
            "submit_key": f"bench-{start + i}", "name": f"job-{(start + i) % 97}", "user": "bench",
            "submit_host": socket.gethostname(), "backend": "local", "state": state, "spec": spec,
            "run_dir": f"/runs/job-{start + i}", "log_paths": {}, "hosts": [], "rank_to_host": {}, "attempt": 1,
            "max_retries": 0, "priority": 0, "nodes": 1, "cpus": 1, "gpus": 0, "mem_mib": 1024,
            "cancel_requested": False, "created_at": now - timedelta(minutes=start + i),
            "updated_at": now if state == "RUNNING" else now - timedelta(minutes=start + i),
            "started_at": now - timedelta(minutes=1) if state == "RUNNING" else None,
        }
        for i in range(count)
    ]  # fmt: skip


def make_db(folder: Path, jobs: int, live: int) -> str:
    db = str(folder / "jobs.db")
    client = Client(db, runs_dir=folder / "runs")
    with client.store.engine.begin() as connection:
        for start in range(0, jobs - live, 5000):
            connection.execute(insert(Job), job_rows(start, min(5000, jobs - live - start), "SUCCEEDED"))
        connection.execute(insert(Job), job_rows(jobs - live, live, "RUNNING"))
    client.close()
    return db


def churn(db: str, next_key: int, count: int) -> None:
    """`count` of the oldest running jobs end and as many new running jobs arrive."""
    client = Client(db)
    with client.store.engine.begin() as connection:
        running = connection.execute(
            Job.__table__.select().where(Job.state == "RUNNING").order_by(Job.id).limit(count)
        ).fetchall()
        ids = [row.id for row in running]
        now = utcnow()
        connection.execute(update(Job).where(Job.id.in_(ids)).values(state="SUCCEEDED", ended_at=now, updated_at=now))
        connection.execute(insert(Job), job_rows(next_key, count, "RUNNING"))
    client.close()


def still_sample() -> ResourceSample:
    return ResourceSample(10.0, 2, 1 << 30, 8 << 30, (), "bench", (10.0, 10.0))


async def measure_refresh(db: str, ticks: int, rounds: int) -> tuple[list[list[float]], int, float]:
    """Each round's tick times (ms), the jobs shown at the end, and the idle repaint wait (ms)."""
    app = XtopApp(db=db, refresh_s=3600, sampler=still_sample)
    durations: list[list[float]] = []
    async with app.run_test(size=(200, 60)) as pilot:
        while not app.state.jobs.loaded:
            await pilot.pause(0.05)
        await pilot.pause(0.2)
        key = 1_000_000
        for _ in range(rounds):
            durations.append([])
            for _ in range(ticks):
                churn(db, key, 5)
                key += 5
                start, began = app.ticks, time.perf_counter()
                app.refresh_now()
                while app.ticks == start:
                    await asyncio.sleep(0.0005)
                await pilot.pause()  # the repaint the tick asked for
                durations[-1].append((time.perf_counter() - began) * 1000)
        shown = len(app.state.jobs.order)
        floor = []  # what waiting for a repaint costs when nothing changed: Textual's frame and idle wait
        for _ in range(10):
            began = time.perf_counter()
            await pilot.pause()
            floor.append((time.perf_counter() - began) * 1000)
    return durations, shown, statistics.median(floor)


def fetch_only_ms(db: str, ticks: int) -> float:
    """The database part of a tick alone (the same churn): what the worker thread spends reading."""
    feed = JobFeed(db)
    feed.fetch()
    times, key = [], 2_000_000
    for _ in range(ticks):
        churn(db, key, 5)
        key += 5
        began = time.perf_counter()
        feed.fetch()
        times.append((time.perf_counter() - began) * 1000)
    feed.close()
    return statistics.median(times)


def full_read_ms(db: str) -> float:
    client = Client(db)
    began = time.perf_counter()
    client.list(limit=None, poll=False)
    elapsed = (time.perf_counter() - began) * 1000
    client.close()
    return elapsed


def metrics_line(step: int) -> bytes:
    return json.dumps({"step": step, "time_unix_s": 1.8e9 + step, "loss": 2.0 + 1 / step, "lr": 3e-4,
                       "grad_norm": 0.5, "tokens": 524288, "tokens_per_s": 51234.5, "step_time_s": 10.2,
                       "max_steps": 10**7, "skipped_steps": 0}).encode() + b"\n"  # fmt: skip


def tail_ms(folder: Path, before: int, new: int = 1000, repeats: int = 5) -> float:
    """Median ms of one poll that finds `new` lines appended to a file of `before` lines."""
    run_dir = folder / f"run-{before}"
    run_dir.mkdir()
    metrics = run_dir / "metrics.jsonl"
    metrics.write_bytes(b"".join(metrics_line(s) for s in range(1, before + 1)))
    source = RunSource(run_dir)
    source.poll()
    step, times = before, []
    for _ in range(repeats):
        with metrics.open("ab") as handle:
            handle.write(b"".join(metrics_line(s) for s in range(step + 1, step + new + 1)))
        step += new
        began = time.perf_counter()
        snap = source.poll()
        times.append((time.perf_counter() - began) * 1000)
        assert snap.step == step
    return statistics.median(times) * 1000 / new


def startup_s(db: str, runs: int = 5) -> tuple[list[float], list[float]]:
    """Seconds to xtop's first paint with rows, and of `import textual.app`, `runs` of each, interleaved."""
    tmux = shutil.which("tmux")
    if tmux is None:
        sys.exit("xtop_refresh: tmux is needed for the start-up figure (apt-get install tmux)")
    firsts, baseline = [], []
    for run in range(runs):
        session = f"xtop-bench-{os.getpid()}-{run}"
        began = time.perf_counter()
        subprocess.run([tmux, "new-session", "-d", "-s", session, "-x", "120", "-y", "40",
                        f"{BIN / 'xtop'} --db {db}"], check=True)  # fmt: skip
        while time.perf_counter() - began < 30:
            pane = [tmux, "capture-pane", "-p", "-t", session]
            screen = subprocess.run(pane, capture_output=True, text=True, check=False).stdout
            if "1 jobs" in screen and "RUNNING" in screen:  # the bar and the newest (running) jobs' rows
                firsts.append(time.perf_counter() - began)
                break
            time.sleep(0.005)
        subprocess.run([tmux, "kill-session", "-t", session], check=False)
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import textual.app"], check=True)
        baseline.append(time.perf_counter() - began)
    return firsts, baseline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--live", type=int, default=100)
    parser.add_argument("--ticks", type=int, default=20, help="ticks per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--startup-runs", type=int, default=5)
    args = parser.parse_args()
    wall_began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="xtop-bench-") as tmp:
        folder = Path(tmp)
        db = make_db(folder, args.jobs, args.live)
        full_ms = full_read_ms(db)
        rounds, shown, floor_ms = asyncio.run(measure_refresh(db, args.ticks, args.rounds))
        durations = [ms for one in rounds for ms in one]
        refresh = statistics.median(durations)
        p90 = sorted(durations)[int(0.9 * (len(durations) - 1))]
        round_medians = [statistics.median(one) for one in rounds]
        fetch_ms = fetch_only_ms(db, args.ticks)
        print(f"refresh of {shown} jobs ({args.live} live, 5 end and 5 arrive per tick): median {refresh:.1f} ms, "
              f"p90 {p90:.1f} ms (rounds' medians {min(round_medians):.1f}-{max(round_medians):.1f} ms), of which "
              f"reading the database {fetch_ms:.1f} ms and the idle repaint wait {floor_ms:.1f} ms; reading every "
              f"job once: {full_ms:.0f} ms ({full_ms / refresh:.0f}x a tick)")  # fmt: skip
        short, long = tail_ms(folder, 1_000), tail_ms(folder, 200_000)
        print(f"tail: {short:.2f} ms per 1k new lines after 1k lines, {long:.2f} ms after 200k lines "
              f"(ratio {long / short:.2f})")  # fmt: skip
        firsts, bare = startup_s(db, args.startup_runs)
        first_paint, bare_s = statistics.median(firsts), statistics.median(bare)
        ratios = [first / base for first, base in zip(firsts, bare, strict=False)]
        print(
            f"start-up to first paint with rows: {first_paint:.2f} s (python -c 'import textual.app': "
            f"{bare_s:.2f} s; ratio {first_paint / bare_s:.2f}, pairs {min(ratios):.2f}-{max(ratios):.2f})"
        )
    figures = {
        "jobs": shown,
        "refresh_ms": round(refresh, 1),
        "refresh_p90_ms": round(p90, 1),
        "refresh_round_min_ms": round(min(round_medians), 1),
        "refresh_round_max_ms": round(max(round_medians), 1),
        "fetch_ms": round(fetch_ms, 1),
        "idle_repaint_wait_ms": round(floor_ms, 1),
        "full_read_ms": round(full_ms, 1),
        "tail_ms_per_1k_lines": round(long, 2),
        "tail_ms_per_1k_lines_short_file": round(short, 2),
        "startup_s": round(first_paint, 3),
        "import_textual_s": round(bare_s, 3),
        "startup_ratio": round(first_paint / bare_s, 3),
        "startup_ratio_min": round(min(ratios), 3),
        "startup_ratio_max": round(max(ratios), 3),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "wall_s": round(time.perf_counter() - wall_began, 1),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
