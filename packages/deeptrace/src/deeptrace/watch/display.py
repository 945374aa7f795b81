"""What `deeptrace watch` shows: a live rich table on a terminal; on a pipe or a log, one line per change."""

from __future__ import annotations

import time

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from deeptrace.watch.session import HangFound
from deeptrace.watch.status import RankView, RunStatus

COLOURS = {
    "progressing": "green", "slow": "yellow", "phase": "cyan", "waiting": "cyan", "stuck": "bold red",
    "crashed": "bold red", "gone": "red", "closed": "dim", "missing": "red",
    "unreadable": "red",
    "healthy": "green", "hung": "bold red", "finished": "dim",
}  # fmt: skip


def status_table(status: RunStatus, hang: HangFound | None = None) -> Group:
    colour = COLOURS.get(status.overall, "white")
    head = Text.assemble((f"{status.overall.upper()}", colour), f"  {status.message}")
    table = Table(show_edge=False, pad_edge=False)
    for column in ("rank", "state", "step", "where", "idle", "note"):
        table.add_column(column, justify="right" if column in ("rank", "step", "idle") else "left")
    for view in status.ranks:
        table.add_row(
            str(view.rank),
            Text(view.state, COLOURS.get(view.state, "white")),
            "—" if view.step is None else str(view.step),
            view.where,
            "—" if view.idle_s is None else f"{view.idle_s:.1f} s",
            view.note,
        )
    parts: list[Text | Table] = [head, table]
    if hang is not None:
        parts.append(Text(f"{hang.verdict.summary}\nverdict: {hang.verdict_path}", "bold red"))
    return Group(*parts)


class ChangeLog:
    """Plain lines for a pipe: the overall verdict and each rank's state, printed only when they change."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._overall: tuple[str, str] | None = None
        self._ranks: dict[int, tuple[str, int | None]] = {}

    def show(self, status: RunStatus, hang: HangFound | None) -> None:
        stamp = time.strftime("%H:%M:%S")
        overall = (status.overall, status.message if status.overall != "healthy" else "")
        if overall != self._overall:
            self._overall = overall
            self.console.print(f"{stamp} {status.overall}: {status.message}", highlight=False, soft_wrap=True)
        for view in status.ranks:
            key = (view.state, view.step if view.state != "progressing" else None)
            if self._ranks.get(view.rank, (None, None))[0] != view.state:
                self.console.print(f"{stamp}   {_line(view)}", highlight=False, soft_wrap=True)
            self._ranks[view.rank] = key
        if hang is not None:
            self.console.print(f"{stamp} HANG: {hang.verdict.summary}", highlight=False, soft_wrap=True)
            for culprit in hang.verdict.culprits:
                for line in culprit.evidence:
                    self.console.print(f"{stamp}   rank {culprit.rank}: {line}", highlight=False, soft_wrap=True)
            self.console.print(f"{stamp} verdict: {hang.verdict_path}", highlight=False, soft_wrap=True)


def _line(view: RankView) -> str:
    idle = "" if view.idle_s is None else f", idle {view.idle_s:.1f} s"
    note = f" — {view.note}" if view.note else ""
    return f"rank {view.rank}: {view.state}, {view.where}{idle}{note}"
