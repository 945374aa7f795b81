"""The live progress line on rank 0: step of max, loss, tokens/s, ETA.

In a terminal it is a rich progress bar that redraws in place; when the output is a file or a pipe (torchrun,
a batch job's log) it prints one plain line per step instead, so logs stay readable.
"""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn


class ProgressLine:
    def __init__(self, max_steps: int, *, enabled: bool) -> None:
        self.max_steps = max_steps
        self.enabled = enabled
        self._console = Console()
        self._live = enabled and self._console.is_terminal
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> ProgressLine:
        if self._live:
            self._progress = Progress(
                TextColumn("step"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("{task.fields[figures]}"),
                TimeRemainingColumn(),
                console=self._console,
            )
            self._progress.start()
            self._task = self._progress.add_task("train", total=self.max_steps, figures="")
        return self

    def update(self, step: int, loss: float, tokens_per_s: float, *, eta_s: float) -> None:
        if not self.enabled:
            return
        figures = f"loss {loss:.4f}  {tokens_per_s:,.0f} tok/s"
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=step, figures=figures)
        else:
            print(f"step {step}/{self.max_steps}  {figures}  eta {_duration(eta_s)}", flush=True)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
