"""The dashboard driven through Textual's Pilot over a real clusterx database and real run directories."""

from __future__ import annotations

import io
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from clusterx import Client
from clusterx.spec import JobSpec
from deeptrace.rundir import RunWriter, StepRecord, layout
from rich.console import Console
from textual.app import App, ComposeResult
from textual.pilot import Pilot
from textual.widgets import Input, Log, Static
from xtop.app import XtopApp
from xtop.chart import LineChart
from xtop.job_table import JobTable
from xtop.screens.base import set_content
from xtop.screens.devices import DevicesScreen
from xtop.screens.dialogs import ConfirmScreen, HelpScreen
from xtop.screens.jobs import JobsScreen
from xtop.screens.logs import LogScreen
from xtop.screens.run import RunScreen
from xtop.screens.trace import TraceScreen

from tests.tui.builders import append_step, no_gpu_resources, set_fake_state, submit_fake, write_run
from tests.tui.reports import report_json

pytestmark = pytest.mark.anyio


async def until(pilot: Pilot[None], predicate: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if predicate():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def one_refresh(pilot: Pilot[None], app: XtopApp) -> None:
    """Wait until a refresh that started after this call has been applied."""
    start = app.ticks
    await until(pilot, lambda: app.ticks >= start + 2, "a refresh")


def text_of(app: XtopApp, selector: str) -> str:
    """The plain text a Static shows (tables and groups rendered as the terminal would)."""
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(app.screen.query_one(selector, Static).content)
    return console.export_text().strip()


def table_names(app: XtopApp) -> list[str]:
    model = app.state.jobs
    return [model.rows[i].name for i in model.order]


class _OneStatic(App[None]):
    CSS = "#s { height: auto; }"

    def compose(self) -> ComposeResult:
        yield Static(id="s")


async def test_new_content_gets_its_height_even_while_a_layout_of_the_widget_is_pending() -> None:
    """The interleaving that cut the run screen's two-line stats to one line on a busy machine, forced (no await
    between the steps): a layout of the widget pending, a layout of the screen measuring the old content, then new
    content. Textual alone keeps the old height there (see set_content)."""
    app = _OneStatic()
    async with app.run_test(size=(20, 10)) as pilot:
        widget = app.query_one("#s", Static)
        await pilot.pause()
        widget.update("one")  # a layout of the widget pending until its next idle
        app.screen._clear_arrangement_cache()  # as another widget's layout request does
        app.screen._refresh_layout()  # "one" measured: one line
        set_content(widget, "two lines " * 3)  # 30 cells at 20 wide
        await pilot.pause()
        await until(pilot, lambda: widget.region.height == 2, "the second line", timeout_s=2.0)


async def test_screens_switch_by_key_and_by_click_and_help_opens(tmp_path: Path) -> None:
    app = XtopApp(db=str(tmp_path / "jobs.db"), refresh_s=60, sampler=no_gpu_resources)
    async with app.run_test(size=(80, 24)) as pilot:
        assert isinstance(app.screen, JobsScreen)
        for key, screen in (("2", RunScreen), ("3", DevicesScreen), ("4", TraceScreen), ("1", JobsScreen)):
            await pilot.press(key)
            assert isinstance(app.screen, screen), key
        await pilot.click("ModeBar", offset=(24, 0))  # " xtop ", " 1 jobs ", " 2 run ", then " 3 devices " at 21
        assert isinstance(app.screen, DevicesScreen)
        await until(pilot, lambda: "none (no NVIDIA driver" in text_of(app, "#devices-gpus"), "the no-GPU note")
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert isinstance(app.screen, DevicesScreen)


async def test_jobs_filter_sort_and_state_changes_show_within_one_refresh(tmp_path: Path) -> None:
    db, fake = str(tmp_path / "jobs.db"), tmp_path / "fake"
    ids = {name: submit_fake(db, fake, name) for name in ("moe-a", "dense-b", "moe-c")}
    app = XtopApp(db=db, refresh_s=0.3, sampler=no_gpu_resources)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.state.jobs.loaded and len(app.state.jobs.order) == 3, "three jobs")
        assert table_names(app) == ["moe-c", "dense-b", "moe-a"]
        await pilot.press("slash", "m", "o", "e")
        await until(pilot, lambda: table_names(app) == ["moe-c", "moe-a"], "the filter")
        assert "filter: moe" in text_of(app, "#jobs-summary")
        await pilot.press("enter")  # keeps the filter, back to the table
        assert isinstance(app.focused, JobTable)
        await pilot.press("escape")
        assert table_names(app) == ["moe-c", "dense-b", "moe-a"]
        await pilot.press("s")  # id -> name, descending
        assert table_names(app) == ["moe-c", "moe-a", "dense-b"]
        await pilot.press("o")
        assert table_names(app) == ["dense-b", "moe-a", "moe-c"]

        set_fake_state(db, fake, ids["dense-b"], "RUNNING")
        await one_refresh(pilot, app)
        assert app.state.jobs.rows[ids["dense-b"]].state == "RUNNING"
        line = app.screen.query_one(JobTable).render_line(1).text  # the first row: dense-b
        assert "dense-b" in line and "RUNNING" in line

        # Another writer of the database (as the local daemon is) moves a job on: shown at the next refresh.
        with sqlite3.connect(db) as connection:
            connection.execute("UPDATE jobs SET state = 'STARTING' WHERE id = ?", (ids["moe-a"],))
        await one_refresh(pilot, app)
        assert app.state.jobs.rows[ids["moe-a"]].state == "STARTING"


async def test_cancel_asks_first_and_resubmit_makes_a_retry(tmp_path: Path) -> None:
    db, fake = str(tmp_path / "jobs.db"), tmp_path / "fake"
    job = submit_fake(db, fake, "victim")
    app = XtopApp(db=db, refresh_s=0.3, sampler=no_gpu_resources)
    client = Client(db)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.state.jobs.order == [job], "the job")
        await pilot.press("c")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert isinstance(app.screen, JobsScreen)
        await one_refresh(pilot, app)
        assert not client.describe(job, poll=False).cancel_requested
        await pilot.press("c")
        await pilot.click("#confirm-yes")  # the mouse answers too
        await until(pilot, lambda: client.describe(job, poll=False).cancel_requested, "the cancel request")
        await until(pilot, lambda: app.state.jobs.rows[job].state == "CANCELLED", "CANCELLED in the table")
        await pilot.press("R")
        await until(pilot, lambda: len(app.state.jobs.order) == 2, "the retry in the table")
        retry = app.state.jobs.order[0]
        assert client.describe(retry, poll=False).retry_of == job
    client.close()


async def test_run_screen_follows_metrics_and_logs_follow_with_search(tmp_path: Path) -> None:
    db, fake = str(tmp_path / "jobs.db"), tmp_path / "fake"
    run_dir = tmp_path / "run"
    writer = write_run(run_dir, steps=3)
    job = submit_fake(db, fake, "train", run_dir=run_dir)
    app = XtopApp(db=db, refresh_s=0.3, sampler=no_gpu_resources)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.state.jobs.order == [job], "the job")
        await pilot.press("enter")  # open the selected job's run
        assert isinstance(app.screen, RunScreen)
        await until(pilot, lambda: "step 3/40" in text_of(app, "#run-stats"), "step 3")
        assert f"job {job}" in text_of(app, "#run-title") and str(run_dir) in text_of(app, "#run-title")
        append_step(writer, 4)
        await one_refresh(pilot, app)
        stats = text_of(app, "#run-stats")
        assert "step 4/40" in stats and "loss 1.5" in stats
        with layout.metrics_path(run_dir).open("ab") as handle:
            handle.write(b'{"step": 5, "lo')  # half written: not a step yet, and no error
        await one_refresh(pilot, app)
        assert "step 4/40" in text_of(app, "#run-stats") and text_of(app, "#run-notes") == ""

        log = Client(db).log_file(job, "stdout")
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("starting\nstep 1 loss 6\nstep 2 loss 3\n")
        await pilot.press("1", "l")
        assert isinstance(app.screen, LogScreen)
        view = app.screen.query_one(Log)
        await until(pilot, lambda: view.line_count >= 3, "the log lines")
        with log.open("a") as handle:
            handle.write("step 3 loss 2\n")
        await until(pilot, lambda: view.line_count >= 4, "the appended line")
        await pilot.press("slash", *"step 2", "enter")
        assert "'step 2': line 3 (1 matching)" in text_of(app, "#log-status")
        await pilot.press("escape")
        assert isinstance(app.screen, JobsScreen)
    writer.close()


async def test_run_screen_shows_the_eval_loss_and_marks_resumed_and_skipped_steps(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with RunWriter(run_dir, rank=0, world_size=1) as writer:
        for step in range(1, 31):  # the first attempt, then a resume from step 20's checkpoint
            skipped = step == 12
            writer.append_step(StepRecord(
                step=step, loss=None if skipped else 6.0 / step, skipped=skipped, max_steps=40,
                eval_loss=7.0 / step if step % 10 == 0 else None,
            ))  # fmt: skip
        writer.append_step(StepRecord(step=21, loss=0.3, resumed_from_step=20, max_steps=40))
    app = XtopApp(db=str(tmp_path / "jobs.db"), run_dirs=[run_dir], refresh_s=3600, sampler=no_gpu_resources)
    async with app.run_test(size=(120, 30)) as pilot:
        assert isinstance(app.screen, RunScreen)
        await until(pilot, lambda: "step 21/40" in text_of(app, "#run-stats"), "step 21")
        assert "eval 0.35 @20" in text_of(app, "#run-stats")  # step 30's evaluation was the interrupted attempt's
        notes = text_of(app, "#run-notes").splitlines()
        assert [line.strip() for line in notes] == ["resumed at step 21 (from step 20)", "skipped: step 12"]
        chart = app.screen.query_one("#chart-loss", LineChart)
        assert chart.border_subtitle == "0.3 · eval 0.35"
        assert chart.overlay is not None and chart.overlay.points() == ([10.0, 20.0], [0.7, 0.35])
        assert [mark.x for mark in chart.marks] == [21, 12]


async def test_bad_input_shows_messages_and_never_ends_the_app(tmp_path: Path) -> None:
    empty = tmp_path / "empty-run"
    empty.mkdir()
    newer = tmp_path / "newer-run"
    write_run(newer, steps=2).close()
    report = newer / layout.REPORT_DIR / "report.json"
    report.parent.mkdir()
    report.write_bytes(orjson.dumps(report_json(schema_version=2)))
    unreachable = "postgresql+psycopg://nobody@127.0.0.1:9/none?connect_timeout=2"
    app = XtopApp(db=unreachable, run_dirs=[empty, newer], refresh_s=0.3, sampler=no_gpu_resources)
    async with app.run_test(size=(80, 24)) as pilot:
        assert isinstance(app.screen, RunScreen)
        await until(pilot, lambda: "no metrics yet" in text_of(app, "#run-notes"), "the no-metrics note")
        await pilot.press("right_square_bracket")
        await until(pilot, lambda: "step 2/40" in text_of(app, "#run-stats"), "the second run")
        await pilot.press("4")
        await until(pilot, lambda: "schema version 2 is newer" in text_of(app, "#trace-report"), "the schema message")
        await pilot.press("1")
        await until(pilot, lambda: "job database unreachable" in text_of(app, "#jobs-status"), "the db message")
        await pilot.press("slash", *"colour:red")
        await until(pilot, lambda: "unknown filter key" in text_of(app, "#jobs-status") or
                    "unreachable" in text_of(app, "#jobs-status"), "a message")  # fmt: skip
        assert isinstance(app.screen.query_one("#jobs-filter", Input), Input)
        await one_refresh(pilot, app)
        assert app.is_running


async def test_trace_screen_shows_findings_and_analyses_in_the_background(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with RunWriter(run_dir, rank=0, world_size=1):
        pass
    report = run_dir / layout.REPORT_DIR / "report.json"
    report.parent.mkdir()
    report.write_bytes(orjson.dumps(report_json(hang=True)))
    app = XtopApp(db=str(tmp_path / "jobs.db"), run_dirs=[run_dir], refresh_s=0.3, sampler=no_gpu_resources,
                  start_mode="trace")  # fmt: skip
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: "stragglers: straggler" in text_of(app, "#trace-report"), "the report")
        body = text_of(app, "#trace-report")
        assert "rank 1: last at 8/9 collectives" in body
        assert "hang: ranks 0 wait in all_gather" in body and "in all_gather (dp #12)" in body and "in forward" in body
        assert "80.0%" in body and "1.50 ms/step" in body
        await pilot.press("a")  # nothing to analyse in this run: deeptrace's own message shows
        await until(pilot, lambda: app.state.analysis is not None and not app.state.analysis.running, "analysis end")
        await until(pilot, lambda: "analysis failed" in text_of(app, "#trace-progress"), "the failure message")
        assert "deeptrace: error" in text_of(app, "#trace-progress")


def test_xtop_never_imports_xtrain_or_torch(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    write_run(run_dir, steps=2).close()
    code = f"""
import asyncio, sys
from xtop.app import XtopApp
from xtop.chart import LineChart
async def main():
    app = XtopApp(db={str(tmp_path / "jobs.db")!r}, run_dirs=[{str(run_dir)!r}], refresh_s=0.2)
    async with app.run_test() as pilot:
        while app.ticks < 2:
            await pilot.pause(0.05)
        for key in "1234":
            await pilot.press(key)
asyncio.run(main())
import xtop.cli, xtop.analysis, xtop.screens.logs
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "xtrain"))
print(loaded)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


async def test_the_table_scrolls_to_its_last_row_as_it_grows(tmp_path: Path) -> None:
    db, fake = str(tmp_path / "jobs.db"), tmp_path / "fake"
    client = Client(db)
    specs = [{"name": f"job-{i}", "command": ["true"], "backend": "fake", "backend_options": {"state_dir": str(fake)}}
             for i in range(40)]  # fmt: skip
    for spec in specs[:30]:
        client.submit(JobSpec.model_validate(spec))
    app = XtopApp(db=db, refresh_s=0.3, sampler=no_gpu_resources)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: len(app.state.jobs.order) == 30, "30 jobs")
        table = app.screen.query_one(JobTable)
        await pilot.press("end")
        assert table.cursor == 29
        visible = [table.render_line(y).text for y in range(1, table.size.height)]
        assert any(line.split()[:2] == ["1", "job-0"] for line in visible), visible
        for spec in specs[30:]:  # more jobs than before: the scrollable area grows while the scrollbar shows
            client.submit(JobSpec.model_validate(spec))
        await until(pilot, lambda: len(app.state.jobs.order) == 40, "40 jobs")
        assert table.virtual_size.height == 41
        await pilot.press("end")
        assert table.cursor == 39 and table.selected is not None and table.selected.name == "job-0"
        assert table.render_line(table.size.height - 1).text.split()[:2] == ["1", "job-0"]
        await pilot.press("home")
        assert table.selected is not None and table.selected.name == "job-39"
        assert int(table.scroll_offset.y) == 0
    client.close()
