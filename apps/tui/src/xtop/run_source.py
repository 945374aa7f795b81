"""What a run directory says now, followed incrementally: metrics.jsonl and every ranks/rank-R.jsonl are tailed
(each poll reads only the bytes appended since the previous one), heartbeats and meta.json are small and read
again, report.json only when it changed. Everything goes through deeptrace's readers and its typed report model.

A poll never raises on what it reads: each unreadable file becomes one line in `RunSnapshot.problems`, naming the
file (and the line, for a corrupt JSON line); a half-written last line is simply not a record yet.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from deeptrace.errors import TraceInputError
from deeptrace.report.model import Report, ReportError, load_report
from deeptrace.rundir import (
    RankStepRecord,
    RecordFollower,
    RunMeta,
    StepRecord,
    follow_metrics,
    follow_rank_records,
    layout,
    rank_position,
    rank_records_files,
    read_heartbeats,
    read_meta,
)

from xtop.series import DecimatedSeries

DEFAULT_STALE_AFTER_S = 60.0
RATE_WINDOW = 20  # steps over which the ETA's step rate is measured
MAX_SKIPPED_SHOWN = 200
MAX_EVALS_KEPT = 64


@dataclass
class RankStatus:
    rank: int
    step: int | None = None
    state: str | None = None  # the heartbeat's: running, closed, crashed; None without a heartbeat
    host: str | None = None
    progress_age_s: float | None = None  # since the rank's last span, collective or step boundary
    heartbeat_age_s: float | None = None  # since its heartbeat file was last written (the process lives)
    where: str | None = None  # the open span or collective, or the announced phase
    mem_allocated_bytes: int | None = None
    mem_peak_bytes: int | None = None
    step_time_s: float | None = None
    stale: bool = False


@dataclass
class RunSnapshot:
    run_dir: Path
    exists: bool = False
    meta: RunMeta | None = None
    last: StepRecord | None = None  # the newest metrics record
    steps_seen: int = 0
    max_steps: int | None = None
    eta_s: float | None = None
    loss: DecimatedSeries = field(default_factory=DecimatedSeries)
    eval_loss: DecimatedSeries = field(default_factory=DecimatedSeries)
    last_eval: tuple[int, float] | None = None  # (step, eval loss) of the newest evaluation
    resumes: list[tuple[int, int]] = field(default_factory=list)  # (first step logged, checkpoint step resumed from)
    skipped: list[int] = field(default_factory=list)  # steps whose update was skipped (the newest MAX_SKIPPED_SHOWN)
    tokens_per_s: DecimatedSeries = field(default_factory=DecimatedSeries)
    grad_norm: DecimatedSeries = field(default_factory=DecimatedSeries)
    ranks: list[RankStatus] = field(default_factory=list)
    report: Report | None = None
    report_problem: str | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # not errors: e.g. "no metrics yet"

    @property
    def step(self) -> int | None:
        return None if self.last is None else self.last.step

    def copy(self) -> RunSnapshot:
        """A copy that the next poll leaves alone: the series grow in place and the lists are refilled, so those
        are copied; everything else a poll replaces rather than changes (records, which are frozen, rank statuses,
        meta, report)."""
        return replace(
            self, loss=self.loss.copy(), eval_loss=self.eval_loss.copy(), tokens_per_s=self.tokens_per_s.copy(),
            grad_norm=self.grad_norm.copy(), resumes=list(self.resumes), skipped=list(self.skipped),
            ranks=list(self.ranks), problems=list(self.problems), notes=list(self.notes),
        )  # fmt: skip


class RunSource:
    """Follows one run directory. `poll` mutates and returns the same snapshot; call it from one thread, and hand
    other threads a `copy()` of it."""

    def __init__(self, run_dir: Path | str, stale_after_s: float = DEFAULT_STALE_AFTER_S) -> None:
        self.run_dir = Path(run_dir)
        self.stale_after_s = stale_after_s
        self.snapshot = RunSnapshot(self.run_dir)
        self._metrics = follow_metrics(self.run_dir)
        self._rank_followers: dict[int, RecordFollower[RankStepRecord]] = {}
        self._rank_last: dict[int, RankStepRecord] = {}
        self._recent: list[tuple[int, float]] = []
        self._evals: list[
            tuple[int, float]
        ] = []  # (step, eval loss), the newest MAX_EVALS_KEPT  # (step, time_unix_s) of the newest records, for the ETA
        self._report_stamp: tuple[int, int] | None = None

    def poll(self, now_wall_s: float | None = None) -> RunSnapshot:
        now = time.time() if now_wall_s is None else now_wall_s
        snap = self.snapshot
        snap.problems, snap.notes = [], []
        snap.exists = self.run_dir.is_dir()
        if not snap.exists:
            snap.notes.append(f"{self.run_dir}: no such directory yet (the run has not started writing)")
            return snap
        if snap.meta is None:
            try:
                snap.meta = read_meta(self.run_dir)
            except TraceInputError as error:
                if layout.meta_path(self.run_dir).exists():
                    snap.problems.append(str(error))
        self._follow_metrics(snap)
        self._follow_ranks(snap, now)
        self._read_report(snap)
        return snap

    # -- metrics.jsonl ------------------------------------------------------------------------------------------
    def _follow_metrics(self, snap: RunSnapshot) -> None:
        try:
            records = self._metrics.poll()
        except TraceInputError as error:  # a corrupt line: named once, following goes on after it
            snap.problems.append(str(error))
            records = []
        for record in records:
            self._take_metrics(snap, record)
        if snap.steps_seen == 0:
            snap.notes.append(f"{layout.metrics_path(self.run_dir)}: no metrics yet")

    def _take_metrics(self, snap: RunSnapshot, record: StepRecord) -> None:
        snap.steps_seen += 1
        if record.resumed_from_step is not None:
            self._resumed(snap, record.step, record.resumed_from_step)
        previous = snap.last
        snap.last = record
        if previous is not None and previous.step == record.step:  # a step logged twice: the later fields count
            update = {name: getattr(record, name) for name in record.model_fields_set}
            snap.last = previous.model_copy(update=update | {"skipped": previous.skipped or record.skipped})
        x = float(record.step)  # the series take the record's own figures: a field logged once is one point
        snap.loss.append(x, record.loss)
        snap.eval_loss.append(x, record.eval_loss)
        if record.eval_loss is not None and math.isfinite(record.eval_loss):
            self._evals.append((record.step, record.eval_loss))
            del self._evals[:-MAX_EVALS_KEPT]
            snap.last_eval = self._evals[-1]
        if record.skipped and record.step not in snap.skipped[-1:]:
            snap.skipped.append(record.step)
            del snap.skipped[:-MAX_SKIPPED_SHOWN]
        snap.tokens_per_s.append(x, record.tokens_per_s)
        snap.grad_norm.append(x, record.grad_norm)
        if record.max_steps is not None:
            snap.max_steps = record.max_steps
        self._recent.append((record.step, record.time_unix_s))
        del self._recent[:-RATE_WINDOW]
        snap.eta_s = self._eta(snap)

    def _resumed(self, snap: RunSnapshot, first_step: int, from_step: int) -> None:
        """A new attempt logs the steps after its checkpoint again: the earlier attempt's are forgotten."""
        snap.resumes.append((first_step, from_step))
        for series in (snap.loss, snap.eval_loss, snap.tokens_per_s, snap.grad_norm):
            series.drop_after(from_step)
        snap.skipped = [step for step in snap.skipped if step <= from_step]
        self._evals = [(step, value) for step, value in self._evals if step <= from_step]
        snap.last_eval = self._evals[-1] if self._evals else None
        snap.last = None
        self._recent.clear()  # the step rate of the new attempt only

    def _eta(self, snap: RunSnapshot) -> float | None:
        if snap.max_steps is None or len(self._recent) < 2 or snap.step is None:
            return None
        (first_step, first_t), (last_step, last_t) = self._recent[0], self._recent[-1]
        if last_step <= first_step:
            return None
        per_step = (last_t - first_t) / (last_step - first_step)
        return max(0, snap.max_steps - snap.step) * per_step

    # -- ranks/ and heartbeat/ ----------------------------------------------------------------------------------
    def _follow_ranks(self, snap: RunSnapshot, now: float) -> None:
        for rank, path in rank_records_files(self.run_dir).items():
            if rank not in self._rank_followers:
                self._rank_followers[rank] = follow_rank_records(path)
        for rank, follower in self._rank_followers.items():
            try:
                records = follower.poll()
            except TraceInputError as error:
                snap.problems.append(str(error))
                continue
            if records:
                self._rank_last[rank] = records[-1]
        errors: dict[int, TraceInputError] = {}
        heartbeats = read_heartbeats(self.run_dir, errors=errors)
        snap.problems += [str(error) for _, error in sorted(errors.items())]
        world = snap.meta.world_size if snap.meta else 0
        ranks = sorted(set(range(world)) | set(self._rank_last) | set(heartbeats) | set(errors))
        statuses = []
        for rank in ranks:
            status = RankStatus(rank)
            record = self._rank_last.get(rank)
            if record is not None:
                status.mem_allocated_bytes, status.mem_peak_bytes = record.mem_allocated_bytes, record.mem_peak_bytes
                status.step_time_s, status.step = record.step_time_s, record.step
            beat = heartbeats.get(rank)
            if beat is not None:
                status.state, status.host, status.step = beat.state, beat.host, beat.step
                status.progress_age_s = max(0.0, now - beat.last_event_wall_s)
                status.heartbeat_age_s = max(0.0, now - beat.written_wall_s)
                status.where = rank_position(beat).brief()
                status.stale = beat.state == "running" and status.progress_age_s > self.stale_after_s
            statuses.append(status)
        snap.ranks = statuses

    # -- deeptrace/report.json ----------------------------------------------------------------------------------
    def _read_report(self, snap: RunSnapshot) -> None:
        path = layout.report_path(self.run_dir)
        try:
            stat = path.stat()
        except FileNotFoundError:
            self._report_stamp, snap.report, snap.report_problem = None, None, None
            return
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._report_stamp:
            return
        self._report_stamp = stamp
        try:
            snap.report, snap.report_problem = load_report(path.read_bytes(), path), None
        except (ReportError, OSError) as error:  # another schema version, a field of the wrong type, unreadable
            snap.report, snap.report_problem = None, str(error)

    def reload_report(self) -> None:
        """Forget report.json's stamp: the next poll reads it again (after an analysis rewrote it)."""
        self._report_stamp = None
