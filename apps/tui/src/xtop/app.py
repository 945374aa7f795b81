"""xtop: one screen over this machine's resources, clusterx's jobs, and the selected run's progress."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import BindingType
from textual.widgets import DataTable, Footer, Header

from xtop.resources import ResourceSample, sample_resources
from xtop.sources import JobSource, RunSnapshot, RunSource
from xtop.widgets import JobsTable, ResourcesPanel, RunPanel


class XtopApp(App[None]):
    CSS_PATH = "xtop.tcss"
    TITLE = "xtop"
    BINDINGS: ClassVar[list[BindingType]] = [("q", "quit", "Quit"), ("r", "refresh", "Refresh now")]

    def __init__(self, db: str | None = None, run_dir: Path | None = None, refresh_s: float = 2.0) -> None:
        super().__init__()
        self.db = db
        self.refresh_s = refresh_s
        self._run_source: RunSource | None = RunSource(run_dir) if run_dir else None
        self._job_source: JobSource | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield ResourcesPanel(id="resources")
        yield JobsTable(id="jobs")
        yield RunPanel(id="run")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(RunPanel).show(None)
        self.action_refresh()
        self.set_interval(self.refresh_s, self.action_refresh)

    def action_refresh(self) -> None:
        self.refresh_data()

    # I/O runs in a worker thread so a slow database or file system never freezes the screen.
    @work(thread=True, exclusive=True, group="refresh")
    def refresh_data(self) -> None:
        resources = sample_resources()
        if self._job_source is None:
            self._job_source = JobSource(self.db)
        jobs = self._job_source.jobs()
        snapshot = self._run_source.poll() if self._run_source else None
        self.call_from_thread(self._show, resources, jobs, snapshot)

    def _show(self, resources: ResourceSample, jobs: list[dict[str, Any]], snap: RunSnapshot | None) -> None:
        self.query_one(ResourcesPanel).show(resources)
        self.query_one(JobsTable).show(jobs)
        self.query_one(RunPanel).show(snap)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Follow the selected job's run directory."""
        if event.row_key.value is None:
            return
        run_dir = self.query_one(JobsTable).run_dirs.get(event.row_key.value)
        if run_dir and (self._run_source is None or str(self._run_source.run_dir) != run_dir):
            self._run_source = RunSource(run_dir)
            self.action_refresh()

    def on_unmount(self) -> None:
        if self._job_source is not None:
            self._job_source.close()
