"""`deeptrace watch`: the command's body (click options are in deeptrace.cli)."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.live import Live

from deeptrace.rundir import layout
from deeptrace.watch.display import ChangeLog, status_table
from deeptrace.watch.node import serve
from deeptrace.watch.session import HangFound, Watch, WatchConfig, exit_code
from deeptrace.watch.status import RunStatus


def run_watch(run_dir: Path, config: WatchConfig, *, once: bool, console: Console, err: Console) -> int:
    watch = Watch(
        run_dir,
        config,
        warn=lambda message: err.print(f"deeptrace: warning: {message}", highlight=False, soft_wrap=True),
    )
    if once:
        judged, hang = watch.step()
        if judged.overall == "waiting":
            err.print(f"deeptrace: error: {run_dir}: {judged.message}", highlight=False, soft_wrap=True)
            return 2
        ChangeLog(console).show(judged, hang)
        return exit_code(judged)
    # A terminal gets a live table; a pipe or a log file one line per change.
    view = _View(console)
    status: RunStatus | None = None
    try:
        while True:
            status, new_hang = watch.look()
            view.show(status)  # first: reading the stacks takes seconds, the status is news now
            if new_hang:
                view.show(status, watch.handle_hang(status))
            if status.overall == "finished":
                return 0
            time.sleep(config.interval_s)
    except KeyboardInterrupt:
        return 0 if status is None else exit_code(status)
    finally:
        view.stop()


class _View:
    def __init__(self, console: Console) -> None:
        self.log = None if console.is_terminal else ChangeLog(console)
        self.live = Live(console=console, auto_refresh=False) if self.log is None else None
        self.hang: HangFound | None = None
        if self.live is not None:
            self.live.start()

    def show(self, status: RunStatus, hang: HangFound | None = None) -> None:
        if status.overall != "hung":
            self.hang = None
        self.hang = hang or self.hang
        if self.log is not None:
            self.log.show(status, hang)
        elif self.live is not None:
            self.live.update(status_table(status, self.hang), refresh=True)

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()


def run_node_helper(run_dir: Path, err: Console) -> int:
    err.print(f"deeptrace watch --node: answering stack requests in {layout.stack_requests_dir(run_dir)}",
              highlight=False, soft_wrap=True)  # fmt: skip
    try:
        serve(run_dir, say=lambda message: err.print(message, highlight=False, soft_wrap=True))
    except KeyboardInterrupt:
        return 0
    return 0
