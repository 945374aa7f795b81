"""The trace screen: deeptrace's report of the current run (overlap and exposed communication per rank, exposed
time per kind and purpose of collective, stragglers with their evidence, a hang with where each rank sits), and `a`
to analyse in the background."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Footer, Static

from xtop.fmt import number
from xtop.screens.base import ModeBar, XtopScreen, set_content, show

if TYPE_CHECKING:
    from deeptrace.report.model import Report  # loaded by the worker, after the first paint


class TraceScreen(XtopScreen):
    mode_name = "trace"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("a", "analyze", "Analyse"),
        Binding("left_square_bracket", "cycle(-1)", "Prev run"),
        Binding("right_square_bracket", "cycle(1)", "Next run"),
    ]

    def compose(self) -> ComposeResult:
        yield ModeBar(self.mode_name)
        yield Static(id="trace-title")
        yield Static(id="trace-progress")
        with VerticalScroll():
            yield Static(id="trace-report")
        yield Footer()

    def on_mount(self) -> None:
        self.update_view()

    def action_analyze(self) -> None:
        self.xtop.start_analysis()

    def action_cycle(self, step: int) -> None:
        self.state.cycle_run(step)
        self.xtop.refresh_now()
        self.update_view()

    def update_view(self) -> None:
        target = self.state.run
        title = self.query_one("#trace-title", Static)
        body = self.query_one("#trace-report", Static)
        show(self.query_one("#trace-progress", Static), self._progress())
        if target is None:
            title.update(Text(" no run selected: pick a job (1, Enter) or start xtop RUN_DIR", style="dim"))
            set_content(body, "")
            return
        snap = target.snapshot
        title.update(Text.assemble(" report of ", (str(target.run_dir), "bold")))
        if snap is None:
            set_content(body, "")
        elif snap.report_problem:
            set_content(body, Text(f" {snap.report_problem}", style="bold red"))
        elif snap.report is None:
            set_content(body, Text(" no deeptrace report yet: press a to analyse this run", style="yellow"))
        else:
            set_content(body, render_report(snap.report))

    def _progress(self) -> Text:
        analysis = self.state.analysis
        if analysis is None:
            return Text("")
        if analysis.running:
            spinner = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"[int(analysis.elapsed_s * 8) % 10]
            last = analysis.lines[-1] if analysis.lines else ""
            return Text(f" {spinner} analysing {analysis.run_dir.name}: {analysis.elapsed_s:.1f} s  {last}", "cyan")
        if analysis.failure:
            return Text(f" analysis failed: {analysis.failure}", style="bold red")
        return Text(f" analysed in {analysis.elapsed_s:.1f} s", style="green")


def render_report(report: Report) -> RenderableType:
    parts: list[RenderableType] = [Text(f" created {report.created} by deeptrace {report.deeptrace_version}", "dim")]
    parts.append(_ranks_table(report))
    parts += _kinds_tables(report)
    parts += _straggler_lines(report)
    parts += _hang_parts(report)
    if report.flight_recorder is not None:
        parts.append(Text(f"\n flight recorder: {report.flight_recorder.summary}"))
    for earlier in report.earlier_attempts:
        parts.append(Text(f" rank {earlier.rank}: earlier attempt {earlier.attempt} set aside", style="dim"))
    for warning in report.warnings[:8]:
        parts.append(Text(f" warning: {warning}", style="yellow"))
    return Group(*parts)


def _ranks_table(report: Report) -> Table:
    table = Table(box=None, header_style="bold", title="per rank", title_justify="left", pad_edge=False)
    for name in ("rank", "overlap", "exposed comm", "compute", "comm", "idle", "last arrivals", "timing"):
        table.add_column(name, justify="left" if name == "timing" else "right", no_wrap=True)
    for rank, entry in report.ranks_sorted():
        window = entry.breakdown
        share = entry.collectives.last_arrival_share
        table.add_row(
            str(rank),
            "n/a" if entry.overlap_pct is None else f"{entry.overlap_pct:.1f}%",
            "n/a" if entry.exposed_comm_ms_per_step is None else f"{entry.exposed_comm_ms_per_step:.2f} ms/step",
            f"{number(window.compute_ms)} ms",
            f"{number(window.comm_ms)} ms",
            f"{number(window.idle_ms)} ms",
            "-" if share is None else f"{100 * share:.0f}%",
            entry.timing,
        )
    return table


def _kinds_tables(report: Report) -> list[RenderableType]:
    """Exposed communication per kind, then per purpose, of collective: the mean over ranks and the worst rank."""
    tables: list[RenderableType] = []
    for purposes, title in ((False, "kind"), (True, "purpose")):
        rows = report.kinds_across_ranks(purposes)
        if not rows:
            continue
        table = Table(box=None, header_style="bold", title=f"exposed per {title} of collective (mean per step)",
                      title_justify="left", pad_edge=False)  # fmt: skip
        for name in (title, "exposed", "of step", "most exposed"):
            table.add_column(name, justify="left" if name == title else "right", no_wrap=True)
        for row in rows:
            exposed, share, worst = row.exposed_ms_per_step, row.exposed_pct_of_step, row.worst_exposed_ms_per_step
            table.add_row(
                row.kind,
                "n/a" if exposed is None else f"{exposed:.2f} ms",
                "n/a" if share is None else f"{share:.1f}%",
                "-" if worst is None else f"{worst:.2f} ms (rank {row.worst_rank})",
            )
        tables += [Text(""), table]
    return tables


def _straggler_lines(report: Report) -> list[RenderableType]:
    stragglers = report.stragglers
    style = "bold red" if stragglers.verdict == "straggler" else "green" if stragglers.verdict == "none" else "yellow"
    lines: list[RenderableType] = [
        Text.assemble("\n stragglers: ", (stragglers.verdict, style), f"  {stragglers.explanation}")
    ]
    lines += [Text(f"   rank {c.rank}: {c.evidence}", style="red") for c in stragglers.culprits]
    lines += [Text(f"   rank {w.rank} waited {w.waited_ms:.1f} ms", style="dim") for w in stragglers.waiting_ranks]
    return lines


def _hang_parts(report: Report) -> list[RenderableType]:
    hang = report.hang
    if hang is None:
        return [Text.assemble("\n hang: ", ("none", "green"))]
    parts: list[RenderableType] = [Text.assemble("\n hang: ", (hang.summary, "bold red"))]
    where = Table(box=None, header_style="bold", pad_edge=False)
    for name in ("rank", "status", "step", "where"):
        where.add_column(name, no_wrap=name != "where")
    for state in hang.ranks_sorted():
        status = Text(state.status, style="bold red" if state.rank in hang.culprit_ranks else "")
        where.add_row(str(state.rank), status, str(state.step), state.brief() or "-")
    parts.append(where)
    parts += [
        Text(f"   rank {c.rank} sits at {c.where or '?'}", style="red")
        for c in (hang.watch.culprits if hang.watch else [])
    ]
    return parts
