"""A job's log, followed as it grows; `/` searches inside it (n / N: next and previous match)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Footer, Input, Log, Static

from xtop.logs import LogTail

MAX_LINES = 50_000


class LogScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "close", "Back"),
        Binding("slash", "search", "Search"),
        Binding("n", "next_match(1)", "Next"),
        Binding("N", "next_match(-1)", "Previous"),
        Binding("f", "toggle_follow", "Follow"),
        Binding("e", "switch_stream", "stdout/stderr"),
    ]

    def __init__(self, title: str, paths: dict[str, Path], refresh_s: float) -> None:
        super().__init__()
        self.title_text = title
        self.paths = paths  # stream name -> file; the first is shown first
        self.stream = next(iter(paths))
        self.refresh_s = refresh_s
        self.tail = LogTail(paths[self.stream])
        self.follow = True
        self.lines: list[str] = []
        self.pattern = ""
        self.match_at: int | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="log-title")
        yield Log(id="log-view", max_lines=MAX_LINES, auto_scroll=True)
        yield Input(placeholder="search (Enter: first match below; n / N: next / previous)", id="log-search")
        yield Static(id="log-status")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#log-search", Input).display = False
        self.poll()
        self.set_interval(self.refresh_s, self.poll)

    def poll(self) -> None:
        new = self.tail.poll()
        if new:
            self.lines.extend(new)
            if len(self.lines) > MAX_LINES:
                del self.lines[: len(self.lines) - MAX_LINES]
            self.query_one(Log).write_lines(new, scroll_end=self.follow)
        self._show_status()

    def _show_status(self) -> None:
        path = self.paths[self.stream]
        title = Text.assemble(" ", (self.title_text, "bold"), f"  {self.stream}: {path}")
        if not path.exists():
            title.append("  (no such file yet)", style="yellow")
        self.query_one("#log-title", Static).update(title)
        status = Text(f" {len(self.lines)} lines  follow {'on' if self.follow else 'off'}")
        if self.pattern:
            if self.match_at is None:
                status.append(f"  '{self.pattern}': no match", style="yellow")
            else:
                count = sum(self.pattern in line for line in self.lines)
                status.append(f"  '{self.pattern}': line {self.match_at + 1} ({count} matching)", style="cyan")
        self.query_one("#log-status", Static).update(status)

    def action_close(self) -> None:
        if self.query_one("#log-search", Input).has_focus:
            self.query_one("#log-search", Input).display = False
            self.query_one(Log).focus()
            return
        self.app.pop_screen()

    def action_search(self) -> None:
        field = self.query_one("#log-search", Input)
        field.display = True
        field.focus()

    @on(Input.Submitted, "#log-search")
    def _searched(self, event: Input.Submitted) -> None:
        self.pattern = event.value
        event.input.display = False
        self.query_one(Log).focus()
        self.follow = False
        self.match_at = None
        top = int(self.query_one(Log).scroll_offset.y)
        self._jump(start=top, step=1)

    def action_next_match(self, step: int) -> None:
        if not self.pattern:
            return
        self.follow = False
        start = (self.match_at if self.match_at is not None else 0) + step
        self._jump(start=start, step=step)

    def _jump(self, start: int, step: int) -> None:
        indices = range(start, len(self.lines)) if step > 0 else range(min(start, len(self.lines) - 1), -1, -1)
        found = next((i for i in indices if self.pattern in self.lines[i]), None)
        if found is None:  # wrap around once
            indices = range(len(self.lines)) if step > 0 else range(len(self.lines) - 1, -1, -1)
            found = next((i for i in indices if self.pattern in self.lines[i]), None)
        self.match_at = found
        if found is not None:
            self.query_one(Log).scroll_to(y=found, animate=False)
        self._show_status()

    def action_toggle_follow(self) -> None:
        self.follow = not self.follow
        if self.follow:
            self.query_one(Log).scroll_end(animate=False)
        self._show_status()

    def action_switch_stream(self) -> None:
        names = list(self.paths)
        self.stream = names[(names.index(self.stream) + 1) % len(names)]
        self.tail = LogTail(self.paths[self.stream])
        self.lines, self.match_at = [], None
        self.query_one(Log).clear()
        self.poll()
