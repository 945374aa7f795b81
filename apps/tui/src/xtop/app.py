"""xtop: clusterx's jobs, a live run, this machine's devices and deeptrace's findings, one screen each.

All reading (the database, run directories, NVML) happens in one worker thread per tick, so a slow database or
file system never freezes the screen; the worker hands its results to the app's thread, which alone changes
what the screens draw. Nothing here imports xtrain or torch.

Start-up is kept to what the first frame needs: the jobs of a SQLite history are glanced at with the standard
library before the jobs screen is composed (so its first frame shows the table's rows), the screens other than
the first are imported when first shown, and the worker (which loads SQLAlchemy and pydantic, and competes with
the app's thread for the interpreter) starts after the first frame is drawn.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.screen import Screen

from xtop.jobs import JobDelta, JobFeed, JobRow
from xtop.resources import ResourceSample, sample_resources
from xtop.screens.base import XtopScreen
from xtop.screens.dialogs import ConfirmScreen, HelpScreen
from xtop.state import RunTarget, XtopState, utc_now

if TYPE_CHECKING:
    from xtop.run_source import RunSnapshot  # deeptrace's readers load in the worker, after the first paint

# Jobs read for the first frame: more than a 200x60 terminal shows.
FIRST_PAGE = 200


def _jobs_screen() -> Screen[None]:
    from xtop.screens.jobs import JobsScreen  # noqa: PLC0415 (each screen is imported when first shown)

    return JobsScreen()


def _run_screen() -> Screen[None]:
    from xtop.screens.run import RunScreen  # noqa: PLC0415

    return RunScreen()


def _devices_screen() -> Screen[None]:
    from xtop.screens.devices import DevicesScreen  # noqa: PLC0415

    return DevicesScreen()


def _trace_screen() -> Screen[None]:
    from xtop.screens.trace import TraceScreen  # noqa: PLC0415

    return TraceScreen()


class XtopApp(App[None]):
    CSS_PATH = "xtop.tcss"
    TITLE = "xtop"
    ENABLE_COMMAND_PALETTE = False  # every action has its key; ctrl+p stays free
    MODES: ClassVar[dict[str, Any]] = {
        "jobs": _jobs_screen,
        "run": _run_screen,
        "devices": _devices_screen,
        "trace": _trace_screen,
    }
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("1", "switch_mode('jobs')", "Jobs", show=False),
        Binding("2", "switch_mode('run')", "Run", show=False),
        Binding("3", "switch_mode('devices')", "Devices", show=False),
        Binding("4", "switch_mode('trace')", "Trace", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("ctrl+r", "refresh_now", "Refresh", show=False),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        db: str | None = None,
        run_dirs: list[Path] | None = None,
        refresh_s: float = 2.0,
        *,
        stale_after_s: float = 60.0,
        clock: Callable[[], datetime] = utc_now,
        wall_clock: Callable[[], float] | None = None,
        sampler: Callable[[], ResourceSample] | None = None,
        feed: JobFeed | None = None,
        start_mode: str | None = None,
    ) -> None:
        """`clock`, `wall_clock` and `sampler` are what the snapshot tests fix (ages, heartbeats, devices)."""
        super().__init__()
        self.refresh_s = refresh_s
        self.state = XtopState(
            feed=feed or JobFeed(db), stale_after_s=stale_after_s, clock=clock, wall_clock=wall_clock,
            sampler=sampler,
        )  # fmt: skip
        for run_dir in run_dirs or []:
            self.state.open_run(Path(run_dir))
        self.state.current_run = 0
        self._start_mode = start_mode or ("run" if run_dirs else "jobs")
        self._first_poll = True
        self._polling = False
        self.ticks = 0  # refreshes applied, for tests waiting on "one refresh"

    def on_mount(self) -> None:
        glanced = self.state.feed.glance(FIRST_PAGE)
        if glanced is not None:  # the first frame shows these; the worker's full read follows
            self._first_poll = False
            self.state.jobs.apply(glanced)
        self.switch_mode(self._start_mode)
        self.call_after_refresh(self._start_polling)

    def _start_polling(self) -> None:
        self.refresh_now()
        self.set_interval(self.refresh_s, self.refresh_now)

    # -- refreshing ---------------------------------------------------------------------------------------------
    def action_refresh_now(self) -> None:
        self.refresh_now()

    def refresh_now(self) -> None:
        # One look at a time: a tick that comes while the previous look still reads (a slow database) is skipped,
        # so the feed's bookkeeping is never changed by two threads at once.
        if self._polling:
            return
        self._polling = True
        self._poll()

    @work(thread=True, group="refresh", exit_on_error=False)
    def _poll(self) -> None:
        try:
            self._look()
        finally:
            self._polling = False

    def _look(self) -> None:
        state = self.state
        if self._first_poll:  # no glance possible: the newest page first, then the full read
            self._first_poll = False
            self.call_from_thread(self._apply_jobs, state.feed.first_page())
        delta = state.feed.fetch()
        sample = (state.sampler or sample_resources)()
        target, snap = state.run, None
        if target is not None:
            if target.source is None:
                from xtop.run_source import RunSource  # noqa: PLC0415 (deeptrace's readers: after first paint)

                target.source = RunSource(target.run_dir, stale_after_s=state.stale_after_s)
            # The source's own snapshot changes during every poll; the screens get a finished copy, in _apply.
            snap = target.source.poll(state.wall_clock() if state.wall_clock else time.time()).copy()
        self.call_from_thread(self._apply, delta, sample, target, snap)

    def _apply_jobs(self, delta: JobDelta) -> None:
        self.state.jobs.apply(delta)
        self._update_screen()

    def _apply(
        self, delta: JobDelta, sample: ResourceSample, target: RunTarget | None, snap: RunSnapshot | None
    ) -> None:
        self.state.jobs.apply(delta)
        self.state.resources.add(sample)
        if target is not None:
            target.snapshot = snap
        self.ticks += 1
        self._update_screen()

    def _update_screen(self) -> None:
        screen = self.screen
        if isinstance(screen, XtopScreen) and screen.is_mounted:
            screen.update_view()
        elif hasattr(screen, "poll") and isinstance(self.screen_stack[0], XtopScreen):
            pass  # the log screen follows its file by itself

    def memory_capacity(self) -> tuple[int, str] | None:
        """What a rank's peak memory is measured against: the first GPU's memory, else this host's RAM."""
        sample = self.state.resources.latest
        if sample is None:
            return None
        if sample.gpus:
            return sample.gpus[0].memory_total_bytes, "GPU memory"
        return sample.memory_total_bytes, "host RAM"

    # -- actions ------------------------------------------------------------------------------------------------
    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def open_job_run(self, job: JobRow) -> None:
        if not job.run_dir:
            self.notify(f"job {job.id} has no run directory", severity="warning")
            return
        self.state.open_run(Path(job.run_dir), job.id)
        self.switch_mode("run")
        self.refresh_now()

    def open_logs(self, job: JobRow) -> None:
        from xtop.screens.logs import LogScreen  # noqa: PLC0415

        try:
            client = self.state.feed.client
            paths = {"stdout": client.log_file(job.id, "stdout"), "stderr": client.log_file(job.id, "stderr")}
        except Exception as error:  # the database went away, or the job did (see JobFeed._guarded)
            self.notify(f"cannot find the logs of job {job.id}: {error}", severity="error")
            return
        self.push_screen(LogScreen(f"job {job.id} {job.name}", paths, refresh_s=min(self.refresh_s, 1.0)))

    def confirm_cancel(self, job: JobRow) -> None:
        if not job.live:
            self.notify(f"job {job.id} has already ended ({job.state})", severity="warning")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self._run_action(lambda client: client.cancel([job.id]), f"cancel requested for job {job.id}")

        self.push_screen(ConfirmScreen(f"Cancel job {job.id} ({job.name}, {job.state})?"), answered)

    def resubmit(self, job: JobRow) -> None:
        def retry(client: Any) -> str:
            record = client.retry(job.id)
            return f"job {record.id} submitted (a retry of job {job.id})"

        self._run_action(retry, None)

    @work(thread=True, exit_on_error=False)
    def _run_action(self, action: Callable[[Any], Any], message: str | None) -> None:
        try:
            result = action(self.state.feed.client)
        except Exception as error:  # clusterx's refusals (not the owner, still running) are user messages
            self.call_from_thread(self.notify, str(error), severity="error", timeout=8)
            return
        self.call_from_thread(self.notify, message or str(result))
        self.call_from_thread(self.refresh_now)

    def start_analysis(self) -> None:
        from xtop.analysis import start_analysis  # noqa: PLC0415

        target = self.state.run
        if target is None:
            self.notify("no run selected to analyse", severity="warning")
            return
        if self.state.analysis is not None and self.state.analysis.running:
            self.notify("an analysis is already running", severity="warning")
            return
        self.state.analysis = start_analysis(target.run_dir)
        self.switch_mode("trace")
        self._watch_analysis()

    @work(thread=True, exclusive=True, group="analysis", exit_on_error=False)
    def _watch_analysis(self) -> None:
        analysis = self.state.analysis
        while analysis is not None and analysis.running:
            self.call_from_thread(self._update_screen)
            time.sleep(0.25)
        self.call_from_thread(self._analysis_done)

    def _analysis_done(self) -> None:
        target = self.state.run
        if target is not None and target.source is not None:
            target.source.reload_report()
        self.refresh_now()
        analysis = self.state.analysis
        if analysis is not None and analysis.failure:
            self.notify(f"deeptrace analyze failed: {analysis.failure}", severity="error", timeout=10)

    def on_unmount(self) -> None:
        self.state.feed.close()
