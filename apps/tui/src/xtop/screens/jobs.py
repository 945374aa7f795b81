"""The jobs screen: clusterx's jobs, live, filtered by a typed query and sorted by keystroke; actions on the
selected job (cancel with confirmation, logs, resubmit, open its run)."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Footer, Input, Static

from xtop.job_table import JobTable
from xtop.screens.base import ModeBar, XtopScreen, show


class JobsScreen(XtopScreen):
    mode_name = "jobs"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter"),
        Binding("s", "sort", "Sort"),
        Binding("o", "order", "Order"),
        Binding("enter", "open_run", "Run", show=True),
        Binding("l", "logs", "Logs"),
        Binding("c", "cancel_job", "Cancel"),
        Binding("R", "resubmit", "Resubmit"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def compose(self) -> ComposeResult:
        yield ModeBar(self.mode_name)
        yield Static(id="jobs-summary")
        yield Input(placeholder="filter: words, or state:run user:bob name:moe backend:slurm id:12", id="jobs-filter")
        yield JobTable(self.state.jobs, clock=self.state.clock, id="jobs-table")
        yield Static(id="jobs-status")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#jobs-filter", Input).display = False
        self.query_one(JobTable).focus()
        self.update_view()

    def update_view(self) -> None:
        model = self.state.jobs
        table = self.query_one(JobTable)
        table.rows_changed()
        live = model.live_count
        arrow = "↓" if model.descending else "↑"
        summary = Text()
        summary.append(f" {len(model.order)}", style="bold")
        summary.append(f" of {len(model.rows)} jobs, {live} live   sort: {model.sort_key} {arrow}")
        if model.query.text:
            summary.append(f"   filter: {model.query.text}", style="bold cyan")
        if not model.loaded and model.problem is None:
            summary.append("   loading…", style="dim")
        show(self.query_one("#jobs-summary", Static), summary, layout=False)  # one line (xtop.tcss)
        status = Text()
        if model.problem:
            status.append(f" {model.problem}", style="bold red")
        elif model.query.problem:
            status.append(f" filter: {model.query.problem}", style="bold red")
        for warning in model.warnings:
            status.append(f" {warning}", style="yellow")
        if not status.plain and not model.rows and model.loaded:
            status.append(" no jobs in this database yet (clusterx submit -- CMD adds one)", style="dim")
        show(self.query_one("#jobs-status", Static), status)

    # -- filter and sort ----------------------------------------------------------------------------------------
    def action_filter(self) -> None:
        field = self.query_one("#jobs-filter", Input)
        field.display = True
        field.focus()

    @on(Input.Changed, "#jobs-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.state.jobs.set_query(event.value)
        self.update_view()

    @on(Input.Submitted, "#jobs-filter")
    def _filter_done(self) -> None:
        field = self.query_one("#jobs-filter", Input)
        field.display = bool(field.value)
        self.query_one(JobTable).focus()

    def action_clear_filter(self) -> None:
        field = self.query_one("#jobs-filter", Input)
        field.value = ""
        field.display = False
        self.state.jobs.set_query("")
        self.query_one(JobTable).focus()
        self.update_view()

    def action_sort(self) -> None:
        self.state.jobs.cycle_sort()
        self.update_view()

    def action_order(self) -> None:
        self.state.jobs.flip_order()
        self.update_view()

    # -- actions on the selected job ----------------------------------------------------------------------------
    def action_open_run(self) -> None:
        job = self.query_one(JobTable).selected
        if job is not None:
            self.xtop.open_job_run(job)

    @on(JobTable.Opened)
    def _opened(self, event: JobTable.Opened) -> None:
        self.xtop.open_job_run(event.job)

    def action_logs(self) -> None:
        job = self.query_one(JobTable).selected
        if job is not None:
            self.xtop.open_logs(job)

    def action_cancel_job(self) -> None:
        job = self.query_one(JobTable).selected
        if job is not None:
            self.xtop.confirm_cancel(job)

    def action_resubmit(self) -> None:
        job = self.query_one(JobTable).selected
        if job is not None:
            self.xtop.resubmit(job)
