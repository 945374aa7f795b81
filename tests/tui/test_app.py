"""The dashboard driven through Textual's Pilot, over a real clusterx database and a real run directory."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
from clusterx import Client
from clusterx.spec import JobSpec
from deeptrace.rundir import RunWriter
from xtop.app import XtopApp
from xtop.widgets import JobsTable, ResourcesPanel, RunPanel


def _make_jobs(db: str, fake_dir: Path, run_dir: Path) -> list[int]:
    client = Client(db)
    ids = [
        client.submit(
            JobSpec(
                name=name,
                command=["true"],
                backend="fake",
                run_dir=str(run_dir),
                backend_options={"state_dir": str(fake_dir)},
            )
        )["id"]
        for name in ("train-a", "train-b")
    ]
    client.close()
    return ids


def _write_run(run_dir: Path, steps: int) -> None:
    with RunWriter(run_dir, rank=0, world_size=1) as writer:
        for step in range(1, steps + 1):
            writer.append_metrics(step, loss=6.0 / step)


@pytest.mark.anyio
async def test_dashboard_shows_jobs_resources_and_follows_the_selected_run(tmp_path: Path) -> None:
    db = str(tmp_path / "jobs.db")
    run_dir = tmp_path / "run-b"
    ids = _make_jobs(db, tmp_path / "fake", run_dir)
    _write_run(run_dir, steps=3)
    app = XtopApp(db=db, refresh_s=60)
    async with app.run_test(size=(140, 40)) as pilot:
        table = app.query_one(JobsTable)
        for _ in range(100):
            await pilot.pause(0.05)
            if table.row_count == 2:
                break
        assert table.row_count == 2
        assert [table.get_row_at(i)[1] for i in range(2)] == ["train-b", "train-a"]
        assert table.get_row_at(0)[0] == str(ids[1])
        assert "MEM" in str(app.query_one(ResourcesPanel).content)
        assert "No run directory selected" in str(app.query_one(RunPanel).content)

        table.focus()
        await pilot.press("enter")  # select the newest job: the dashboard follows its run directory
        for _ in range(100):
            await pilot.pause(0.05)
            if "steps recorded" in str(app.query_one(RunPanel).content):
                break
        panel_text = str(app.query_one(RunPanel).content)
        assert str(run_dir) in panel_text
        assert "steps recorded: 3" in panel_text
        assert "loss=2" in panel_text  # the last step's loss, 6/3


def test_xtop_runs_in_a_real_terminal(tmp_path: Path, tmux: str) -> None:
    db = str(tmp_path / "jobs.db")
    run_dir = tmp_path / "run-a"
    _make_jobs(db, tmp_path / "fake", run_dir)
    _write_run(run_dir, steps=5)
    xtop = Path(sys.executable).parent / "xtop"
    session = f"xtop-test-{tmp_path.name}"
    command = f"{xtop} --db {db} --run-dir {run_dir} --refresh 0.5"
    subprocess.run([tmux, "new-session", "-d", "-s", session, "-x", "150", "-y", "40", command], check=True)
    # A detached session may keep tmux's default 80x24; ask for the size the layout is checked at.
    subprocess.run([tmux, "resize-window", "-t", session, "-x", "150", "-y", "40"], check=False)
    try:
        screen = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            screen = subprocess.run(
                [tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True, check=True
            ).stdout
            if "train-b" in screen and "steps recorded: 5" in screen:
                break
            time.sleep(0.3)
        assert "train-a" in screen and "train-b" in screen, screen
        assert "steps recorded: 5" in screen, screen
        assert "CPU" in screen and "MEM" in screen, screen
        subprocess.run([tmux, "send-keys", "-t", session, "q"], check=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            alive = subprocess.run([tmux, "has-session", "-t", session], capture_output=True, check=False)
            if alive.returncode != 0:
                break
            time.sleep(0.2)
        assert alive.returncode != 0, "xtop did not quit on 'q'"
    finally:
        subprocess.run([tmux, "kill-session", "-t", session], capture_output=True, check=False)
