"""What the dashboard reads, kept apart from how it draws: clusterx's job records and a run directory.

Everything here is plain Python over the two contracts (the job record of `clusterx describe --json`, the run
directory of deeptrace's format), so it is tested without a terminal and the widgets stay thin.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterx import Client
from deeptrace.errors import TraceInputError
from deeptrace.report.model import Report, ReportError, load_report
from deeptrace.rundir import JsonlFollower, layout, read_heartbeats


class JobSource:
    """The newest jobs of one clusterx database."""

    def __init__(self, db: str | None, limit: int = 50) -> None:
        self._client = Client(db)
        self.limit = limit

    def jobs(self) -> list[dict[str, Any]]:
        # poll=True lets the client refresh jobs of polled backends (Slurm); the local daemon writes its own.
        return self._client.list(limit=self.limit, poll=True)

    def close(self) -> None:
        self._client.close()


@dataclass
class RankLiveness:
    rank: int
    step: int | None
    state: str
    seconds_since_progress: float


@dataclass
class RunSnapshot:
    """What a run directory says now."""

    run_dir: Path
    steps_seen: int = 0
    last_metrics: dict[str, Any] = field(default_factory=dict)
    ranks: list[RankLiveness] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)  # from deeptrace's report.json, when it exists
    problems: list[str] = field(default_factory=list)  # unreadable files, each named


class RunSource:
    """Follows one run directory: metrics.jsonl incrementally, heartbeats and the analyser's report on each poll."""

    def __init__(self, run_dir: Path | str) -> None:
        self.run_dir = Path(run_dir)
        self._metrics = JsonlFollower(layout.metrics_path(self.run_dir))
        self._snapshot = RunSnapshot(self.run_dir)
        # report.json is rewritten only when `deeptrace analyze` runs: parse it again only when it changed.
        self._report_stamp: tuple[int, int] | None = None
        self._report_lines: list[str] = []
        self._report_problem: str | None = None

    def poll(self, now_wall_s: float | None = None) -> RunSnapshot:
        now = time.time() if now_wall_s is None else now_wall_s
        snap = self._snapshot
        snap.problems = []
        try:
            new_records = self._metrics.poll()
        except TraceInputError as error:
            snap.problems.append(str(error))
            new_records = []
        if new_records:
            snap.steps_seen += len(new_records)
            snap.last_metrics = new_records[-1]
        # One unreadable heartbeat must not hide the others: collect its error and show the rest.
        heartbeat_errors: dict[int, TraceInputError] = {}
        heartbeats = read_heartbeats(self.run_dir, errors=heartbeat_errors)
        snap.problems += [str(error) for _, error in sorted(heartbeat_errors.items())]
        snap.ranks = [
            RankLiveness(
                rank=rank,
                step=beat.step,
                state=beat.state,
                seconds_since_progress=max(0.0, now - beat.last_event_wall_s),
            )
            for rank, beat in sorted(heartbeats.items())
        ]
        snap.findings = self._report_findings(snap.problems)
        return snap

    def _report_findings(self, problems: list[str]) -> list[str]:
        report_path = self.run_dir / layout.REPORT_DIR / "report.json"
        try:
            stat = report_path.stat()
        except FileNotFoundError:
            self._report_stamp, self._report_lines, self._report_problem = None, [], None
            return []
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._report_stamp:
            self._report_stamp, self._report_lines, self._report_problem = stamp, [], None
            try:
                self._report_lines = summarize_report(load_report(report_path.read_bytes(), report_path))
            except ReportError as error:  # invalid JSON, another schema version, a field of the wrong type
                self._report_problem = str(error)
        if self._report_problem is not None:
            problems.append(self._report_problem)
        return self._report_lines


def summarize_report(report: Report) -> list[str]:
    """A few lines of what deeptrace found: overlap and exposed communication per rank, stragglers, hang."""
    lines: list[str] = []
    for rank, entry in report.ranks_sorted():
        overlap, exposed = entry.overlap_pct, entry.exposed_comm_ms_per_step
        overlap_text = "n/a" if overlap is None else f"{overlap:.1f}%"
        exposed_text = "n/a" if exposed is None else f"{exposed:.2f} ms/step"
        lines.append(f"rank {rank}: overlap {overlap_text}, exposed comm {exposed_text}")
    stragglers = report.stragglers
    if stragglers.verdict == "straggler":
        ranks = ", ".join(str(c.rank) for c in stragglers.culprits)
        lines.append(f"straggler: rank {ranks} ({stragglers.explanation})")
    if report.hang is not None:
        lines.append(f"hang: {report.hang.summary}")
        if report.hang.watch is not None:
            lines += [f"hang: rank {c.rank} waits at {c.where}" for c in report.hang.watch.culprits]
    for earlier in report.earlier_attempts:
        lines.append(f"rank {earlier.rank}: earlier attempt {earlier.attempt} set aside (not analysed)")
    lines.extend(f"warning: {w}" for w in report.warnings[:5])
    return lines
