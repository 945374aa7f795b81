"""The run screen: a run directory followed live. Loss (with the eval loss over it), tokens/s and grad-norm
curves, the steps where the run resumed or skipped its update marked on the loss chart; step of max, ETA, the
last eval loss, MFU, learning rate, skipped steps; per rank the memory allocated and peak and the heartbeat's
age, stale ranks flagged."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.widgets import Footer, Static

from xtop.chart import LineChart, Mark
from xtop.fmt import bar, duration, gib, number
from xtop.jobs import state_style
from xtop.screens.base import ModeBar, XtopScreen, set_content, show

if TYPE_CHECKING:
    from xtop.run_source import RunSnapshot  # deeptrace's readers load in the worker, after the first paint

EVAL_STYLE = "bold yellow"
RESUMED_STYLE = "on dark_blue"
SKIPPED_STYLE = "on dark_red"


class RunScreen(XtopScreen):
    mode_name = "run"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left_square_bracket", "cycle(-1)", "Prev run"),
        Binding("right_square_bracket", "cycle(1)", "Next run"),
        Binding("a", "analyze", "Analyse"),
    ]

    def compose(self) -> ComposeResult:
        yield ModeBar(self.mode_name)
        yield Static(id="run-title")
        yield Static(id="run-stats")
        with Horizontal(id="run-charts"):
            yield LineChart("loss", id="chart-loss", style="green", overlay_title="eval", overlay_style=EVAL_STYLE)
            yield LineChart("tokens/s", id="chart-tokens", style="cyan")
            yield LineChart("grad norm", id="chart-grad", style="magenta")
        yield Static(id="run-ranks")
        yield Static(id="run-notes")
        yield Footer()

    def on_mount(self) -> None:
        self.update_view()

    def action_cycle(self, step: int) -> None:
        self.state.cycle_run(step)
        self.xtop.refresh_now()
        self.update_view()

    def action_analyze(self) -> None:
        self.xtop.start_analysis()

    def update_view(self) -> None:
        target = self.state.run
        title = self.query_one("#run-title", Static)
        if target is None:
            title.update(Text(" no run: pick a job with a run directory (1, Enter) or start xtop RUN_DIR", "dim"))
            self._clear()
            return
        snap = target.snapshot
        # The job and its state first: a long run directory is what gets cut at the right edge.
        text = Text(" ")
        if target.job_id is not None:
            job = self.state.jobs.rows.get(target.job_id)
            text.append(f"job {target.job_id}")
            if job is not None:
                text.append(f" {job.state}", style=state_style(job.state))
            text.append("  ")
        if len(self.state.runs) > 1:
            text.append(f"[{self.state.current_run + 1}/{len(self.state.runs)}] ", style="dim")
        text.append(str(target.run_dir), style="bold")
        show(title, text)
        if snap is None:
            self._clear()
            return
        show(self.query_one("#run-stats", Static), _stats(snap))
        self.query_one("#chart-loss", LineChart).show(snap.loss, snap.eval_loss, _marks(snap))
        self.query_one("#chart-tokens", LineChart).show(snap.tokens_per_s)
        self.query_one("#chart-grad", LineChart).show(snap.grad_norm)
        set_content(self.query_one("#run-ranks", Static), _ranks(snap, self.xtop.memory_capacity()))
        notes = Text()
        for line in snap.problems:
            notes.append(f" {line}\n", style="bold red")
        for line in snap.notes:
            notes.append(f" {line}\n", style="yellow")
        notes.append_text(_marks_legend(snap))
        notes.rstrip()
        show(self.query_one("#run-notes", Static), notes)

    def _clear(self) -> None:
        for name in ("#run-stats", "#run-ranks", "#run-notes"):
            set_content(self.query_one(name, Static), "")


def _stats(snap: RunSnapshot) -> Text:
    last = snap.last
    text = Text(" step ")
    step = snap.step
    text.append("-" if step is None else str(step), style="bold")
    if snap.max_steps:
        text.append(f"/{snap.max_steps}")
        if step is not None:
            text.append(f" ({100 * step / snap.max_steps:.0f}%)")
    text.append("  ETA ")
    text.append(duration(snap.eta_s) if step != snap.max_steps else "done", style="bold")
    mfu, lr = (None, None) if last is None else (last.mfu, last.lr)
    evaluated = snap.last_eval
    fields = (
        ("loss", number(None if last is None else last.loss)),
        ("eval", "-" if evaluated is None else f"{number(evaluated[1])} @{evaluated[0]}"),
        ("tok/s", number(None if last is None else last.tokens_per_s)),
        ("grad", number(None if last is None else last.grad_norm)),
        ("lr", "-" if lr is None else f"{lr:.2e}"),
        ("MFU", "n/a" if mfu is None else f"{100 * mfu:.1f}%"),
        ("skipped", str(0 if last is None or last.skipped_steps is None else last.skipped_steps)),
    )
    for name, value in fields:
        text.append(f"  {name} ")
        text.append(value, style="bold")
    return text


def _marks(snap: RunSnapshot) -> list[Mark]:
    return [Mark(first, RESUMED_STYLE) for first, _ in snap.resumes] + [Mark(s, SKIPPED_STYLE) for s in snap.skipped]


def _marks_legend(snap: RunSnapshot) -> Text:
    """What the loss chart's tinted columns mean: one line each for resumes and skipped steps."""
    text = Text()
    if snap.resumes:
        text.append(" ")
        text.append("  ", style=RESUMED_STYLE)
        text.append(
            " resumed at " + ", ".join(f"step {first} ({_resumed_from(step)})" for first, step in snap.resumes[-3:])
        )
        text.append(f" and {len(snap.resumes) - 3} earlier" if len(snap.resumes) > 3 else "")
        text.append("\n")
    if snap.skipped:
        shown = snap.skipped[-8:]
        text.append(" ")
        text.append("  ", style=SKIPPED_STYLE)
        text.append(" skipped: step" + ("s " if len(snap.skipped) > 1 else " ") + ", ".join(map(str, shown)))
        text.append(f" (and {len(snap.skipped) - len(shown)} before)" if len(snap.skipped) > len(shown) else "")
        text.append("\n")
    return text


def _resumed_from(step: int) -> str:
    return "no checkpoint: started over" if step == 0 else f"from step {step}"


def _ranks(snap: RunSnapshot, capacity: tuple[int, str] | None) -> Table:
    table = Table(box=None, pad_edge=False, expand=True, header_style="bold")
    table.add_column("rank", justify="right", no_wrap=True)
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("mem alloc", justify="right", no_wrap=True)
    table.add_column("peak", justify="right", no_wrap=True)
    table.add_column("of " + (capacity[1] if capacity else "?"), no_wrap=True, min_width=14)
    table.add_column("progress", justify="right", no_wrap=True)
    table.add_column("beat", justify="right", no_wrap=True)
    table.add_column("state", no_wrap=True, overflow="ellipsis", ratio=1)
    for rank in snap.ranks:
        fraction = None
        if capacity and rank.mem_peak_bytes is not None and capacity[0]:
            fraction = rank.mem_peak_bytes / capacity[0]
        state = Text(rank.state or "no heartbeat", style="" if rank.state else "yellow")
        if rank.stale:
            state = Text(f"STALE {rank.where or ''}".rstrip(), style="bold red")
        elif rank.state == "crashed":
            state.stylize("bold red")
        elif rank.where and rank.state == "running":
            state.append(f" {rank.where}", style="dim")
        table.add_row(
            str(rank.rank),
            "-" if rank.step is None else str(rank.step),
            gib(rank.mem_allocated_bytes),
            gib(rank.mem_peak_bytes),
            Text(
                bar(fraction, 10) + (f" {100 * fraction:3.0f}%" if fraction is not None else ""),
                style="red" if fraction and fraction > 0.9 else "",
            ),
            duration(rank.progress_age_s) + " ago" if rank.progress_age_s is not None else "-",
            duration(rank.heartbeat_age_s),
            state,
        )
    if not snap.ranks:
        table.add_row("-", "-", "-", "-", "", "-", "-", Text("no rank has written yet", style="dim"))
    return table
