"""Screens pushed over the others: the cancel confirmation and the help."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question: y or the Yes button answers True; n, Escape or No answers False."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: 60; height: auto; border: thick $error; background: $surface; padding: 1 2; }
    ConfirmScreen Horizontal { height: auto; align: center middle; margin-top: 1; }
    ConfirmScreen Button { margin: 0 2; }
    """

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self.question, style="bold"), id="confirm-question")
            with Horizontal():
                yield Button("Yes (y)", variant="error", id="confirm-yes")
                yield Button("No (n)", variant="primary", id="confirm-no")

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


HELP = """\
[b]xtop[/b]: clusterx jobs, a live run, this machine's devices and deeptrace's findings.

[b]Screens[/b]   1 jobs   2 run   3 devices   4 trace   ? this help   q quit   (the top bar is clickable)

[b]Jobs[/b]      up/down, page up/down, home/end (or the mouse) select a job
          /  filter: words match name, user, state or backend; or state:run user:bob name:moe
             backend:slurm id:12 (all must match); Enter keeps it, Escape clears it
          s  sort by the next column (id, name, user, state, age, run time)   o  reverse the order
          Enter (or double click)  open the job's run     l  its logs (followed)
          c  cancel it (asks first)     R  resubmit it (clusterx retry; the job must have ended)

[b]Run[/b]       step of max, ETA, loss / tokens/s / grad-norm curves, MFU, learning rate, skipped steps;
          per rank: memory allocated and peak, time since progress and since the heartbeat, STALE ranks
          [ ]  previous / next run (several RUN_DIRs on the command line)    a  analyse with deeptrace

[b]Devices[/b]   CPU and memory of this host; per GPU memory, utilisation, power, temperature (NVML)

[b]Trace[/b]     deeptrace's report: overlap and exposed communication per rank, stragglers with their
          evidence, a hang with where each rank sits     a  run `deeptrace analyze` in the background

[b]Logs[/b]      /  search   n / N  next / previous match   f  follow on/off   e  stdout/stderr   Esc back
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "close", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical { width: 100; max-width: 100%; height: auto; max-height: 100%; border: round $accent;
                            background: $surface; padding: 0 1; overflow-y: auto; }
    """

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(HELP)

    def action_close(self) -> None:
        self.dismiss(None)
