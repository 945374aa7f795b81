"""The first frame shows the jobs table's visible rows: they are glanced at (clusterx.glance, standard library
only) before the jobs screen is composed, and the worker that loads clusterx's client starts only after that
frame is drawn."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from clusterx import Client, JobSpec
from clusterx.db.models import Job, utcnow
from sqlalchemy import insert
from xtop.app import XtopApp
from xtop.job_table import JobTable
from xtop.jobs import JobDelta, JobFeed

from tests.tui.builders import no_gpu_resources

BIN = Path(sys.executable).parent


def _jobs_db(folder: Path, count: int) -> str:
    db = str(folder / "jobs.db")
    client = Client(db, runs_dir=folder / "runs")
    now = utcnow()
    spec = JobSpec(command=["true"], workdir="/w", run_dir="/r").model_dump(mode="json")
    rows = [
        {
            "submit_key": f"k{i}", "name": f"job-{i:04d}", "user": "alice", "submit_host": "h", "backend": "local",
            "state": "SUCCEEDED" if i < count - 3 else "RUNNING", "spec": spec, "run_dir": f"/runs/{i}",
            "log_paths": {}, "hosts": [], "rank_to_host": {}, "attempt": 1, "max_retries": 0, "priority": 0,
            "nodes": 1, "cpus": 1, "gpus": 0, "mem_mib": 0, "cancel_requested": False,
            "created_at": now - timedelta(minutes=count - i), "updated_at": now,
        }
        for i in range(1, count + 1)
    ]  # fmt: skip
    with client.store.engine.begin() as connection:
        connection.execute(insert(Job), rows)
    client.close()
    return db


class HeldFeed(JobFeed):
    """A feed whose reads through the client wait until released: whatever the table shows meanwhile came from
    the glance."""

    def __init__(self, db: str) -> None:
        super().__init__(db)
        self.release = threading.Event()

    def fetch(self) -> JobDelta:
        self.release.wait(timeout=30)
        return super().fetch()


@pytest.mark.anyio
async def test_the_first_frame_shows_the_newest_jobs_before_any_read_through_the_client(tmp_path: Path) -> None:
    db = _jobs_db(tmp_path, 300)
    feed = HeldFeed(db)
    app = XtopApp(db=db, refresh_s=3600, sampler=no_gpu_resources, feed=feed)
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.pause()
        table = app.screen.query_one(JobTable)
        lines = [table.render_line(y).text for y in range(1, table.size.height)]
        assert app.ticks == 0 and not app.state.jobs.loaded  # nothing came through the client yet
        assert len(lines) == 55  # 60 rows less the screens' bar, the summary, the header, the status and the footer
        assert [line.split()[:2] for line in lines[:3]] == [
            ["300", "job-0300"],
            ["299", "job-0299"],
            ["298", "job-0298"],
        ]
        assert all(f"job-{300 - i:04d}" in line for i, line in enumerate(lines))  # every visible row
        feed.release.set()
        while not app.state.jobs.loaded:
            await pilot.pause(0.05)
        assert len(app.state.jobs.order) == 300


def test_in_a_terminal_the_bar_never_shows_without_the_rows(tmp_path: Path, tmux: str) -> None:
    """xtop in tmux, its screen captured as fast as tmux answers from the start: every capture that shows the
    screens' bar shows the newest jobs too (before the glance, the bar came a few hundred ms before them)."""
    db = _jobs_db(tmp_path, 500)
    name = f"xtop-first-paint-{os.getpid()}"
    subprocess.run([tmux, "new-session", "-d", "-s", name, "-x", "120", "-y", "40", f"{BIN / 'xtop'} --db {db}"],
                   check=True)  # fmt: skip
    try:
        deadline, captures = time.monotonic() + 60, []
        while time.monotonic() < deadline:
            pane = subprocess.run(
                [tmux, "capture-pane", "-p", "-t", name], capture_output=True, text=True, check=False
            ).stdout
            if "1 jobs" in pane:
                captures.append(pane)
                if len(captures) >= 5:
                    break
        assert captures, "xtop never drew its screens' bar"
        for pane in captures:
            assert "job-0500" in pane and "job-0495" in pane, pane
    finally:
        subprocess.run([tmux, "kill-session", "-t", name], capture_output=True, check=False)
