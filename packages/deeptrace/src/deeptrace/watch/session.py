"""`deeptrace watch`'s loop: judge the run every interval, and on a hang read the stacks, decide, write, alert."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from deeptrace.rundir import read_heartbeats
from deeptrace.watch.alerts import post_webhook, run_on_hang
from deeptrace.watch.capture import CaptureConfig, capture_all
from deeptrace.watch.follow import TraceFollower
from deeptrace.watch.hangdir import new_hang_dir, write_stacks, write_verdict
from deeptrace.watch.status import RunStatus, SlowConfig, judge
from deeptrace.watch.verdict import Verdict, decide

EXIT_HEALTHY = 0
EXIT_SLOW = 3
EXIT_HUNG = 4


@dataclass(frozen=True)
class WatchConfig:
    threshold_s: float = 120.0
    interval_s: float = 2.0
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    slow: SlowConfig = field(default_factory=SlowConfig)
    on_hang: str | None = None
    webhook: str | None = None


@dataclass(frozen=True)
class HangFound:
    folder: Path
    verdict_path: Path
    verdict: Verdict
    alert_problems: list[str]


class Watch:
    """One watched run directory. `step()` judges once (and handles a new hang); `run()` repeats it."""

    def __init__(self, run_dir: Path, config: WatchConfig, warn: Callable[[str], None] | None = None) -> None:
        self.run_dir = run_dir
        self.config = config
        self.follower = TraceFollower(run_dir)
        self.warn = warn or (lambda _message: None)
        self.hangs: list[HangFound] = []
        self._warned: set[str] = set()  # problems of files (a cut-off one, say) are said once
        self._hang_key: tuple[object, ...] | None = None  # the hang already handled: not diagnosed twice

    def step(self, now: float | None = None) -> tuple[RunStatus, HangFound | None]:
        """Judge once and handle a new hang at once (for --once and tests)."""
        status, new_hang = self.look(now)
        return status, self.handle_hang(status) if new_hang else None

    def look(self, now: float | None = None) -> tuple[RunStatus, bool]:
        """Judge once: the status, and whether it is a hang not handled yet (then call `handle_hang`)."""
        traces = self.follower.poll()
        for trace in traces.values():
            if trace.problem:
                self._warn_once(trace.problem)
                trace.problem = None
        status = judge(self.run_dir, traces, self.config.threshold_s, time.time() if now is None else now,
                       self.config.slow)  # fmt: skip
        if status.overall != "hung" or status.hang is None:
            self._hang_key = None
            return status, False
        hang = status.hang
        key = tuple(
            (r, s.status, s.step, s.in_collective, s.open_span) for r, s in sorted(hang.ranks.items())
        )  # the same ranks stopped at the same places: the same hang
        if key == self._hang_key:
            return status, False
        self._hang_key = key
        return status, True

    def _warn_once(self, problem: str) -> None:
        if problem not in self._warned:
            self._warned.add(problem)
            self.warn(problem)

    def handle_hang(self, status: RunStatus) -> HangFound:
        """Read every live rank's stacks (several snapshots), decide, write the hang folder, alert."""
        assert status.hang is not None
        folder = new_hang_dir(self.run_dir)
        beats = read_heartbeats(self.run_dir, errors={})
        # Every rank that is still alive: the waiting ones' stacks are evidence too (where they wait).
        alive = {r: b for r, b in beats.items() if b.state == "running"}
        stacks = capture_all(self.run_dir, alive, self.config.capture, folder)
        write_stacks(folder, stacks)
        verdict = decide(status.hang, stacks, self.config.threshold_s)
        path = write_verdict(folder, verdict, self.run_dir)
        problems = []
        if self.config.on_hang:
            problems.append(run_on_hang(self.config.on_hang, path))
        if self.config.webhook:
            problems.append(post_webhook(self.config.webhook, verdict.to_dict(str(self.run_dir))))
        for problem in filter(None, problems):
            self.warn(problem)
        found = HangFound(folder, path, verdict, [p for p in problems if p])
        self.hangs.append(found)
        return found


def exit_code(status: RunStatus) -> int:
    return {"hung": EXIT_HUNG, "slow": EXIT_SLOW}.get(status.overall, EXIT_HEALTHY)
