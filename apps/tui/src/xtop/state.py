"""Everything the screens show, held by the app and changed only on its thread (the worker hands results over)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from xtop.jobs import JobFeed, JobTableModel
from xtop.resources import ResourceHistory, ResourceSample

if TYPE_CHECKING:
    from xtop.analysis import Analysis
    from xtop.run_source import RunSnapshot, RunSource


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class RunTarget:
    """A run the run and trace screens can show: a directory, and the job it belongs to when known."""

    run_dir: Path
    job_id: int | None = None
    source: RunSource | None = None  # made and polled in the worker (it loads deeptrace's readers)
    snapshot: RunSnapshot | None = None  # the newest finished poll, a copy set on the app's thread: what screens show


@dataclass
class XtopState:
    feed: JobFeed
    jobs: JobTableModel = field(default_factory=JobTableModel)
    runs: list[RunTarget] = field(default_factory=list)
    current_run: int = 0
    resources: ResourceHistory = field(default_factory=ResourceHistory)
    analysis: Analysis | None = None
    stale_after_s: float = 60.0
    clock: Callable[[], datetime] = utc_now
    wall_clock: Callable[[], float] | None = None  # for heartbeat ages; None: time.time
    sampler: Callable[[], ResourceSample] | None = None

    @property
    def run(self) -> RunTarget | None:
        return self.runs[self.current_run] if self.runs else None

    def open_run(self, run_dir: Path, job_id: int | None = None) -> RunTarget:
        """Show this run (added to the list when new)."""
        for index, target in enumerate(self.runs):
            if target.run_dir == run_dir:
                self.current_run = index
                if job_id is not None:
                    target.job_id = job_id
                return target
        self.runs.append(RunTarget(run_dir, job_id))
        self.current_run = len(self.runs) - 1
        return self.runs[-1]

    def cycle_run(self, step: int) -> None:
        if self.runs:
            self.current_run = (self.current_run + step) % len(self.runs)
