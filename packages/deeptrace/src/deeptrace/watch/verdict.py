"""The hang verdict: the heartbeats' account (who never entered which collective) checked against the stacks.

Over time: a rank's training-thread stack that is the same in every snapshot, seconds apart, is frozen there.
Across ranks: ranks are grouped by where their training thread waits (its innermost frame in the program's own
code, library and deeptrace frames skipped); a rank alone in its place while the others share one is the odd
one. The culprit is the rank the heartbeats name (its collective sequence number lags, or its step is behind);
where they name none, the odd rank by its stack. The verdict names its file:line and the evidence for it.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deeptrace import __version__
from deeptrace.analysis.hang import HangReport
from deeptrace.watch.stacks import Frame, StackSnapshot

VERDICT_SCHEMA = "deeptrace.hang"
VERDICT_SCHEMA_VERSION = 1
# deeptrace's own folder (its span contexts sit between the program's frames and the collective), then the
# places libraries live. A frame in none of them is the program's.
_LIBRARY_MARKERS = (
    str(Path(__file__).parents[1]) + "/",
    "/site-packages/",
    "/dist-packages/",
    "/lib/python3",
    "<frozen ",
)


def is_program_frame(frame: Frame) -> bool:
    """A frame of the training program itself: not native, not the standard library, torch, or deeptrace."""
    return not frame.native and not any(marker in frame.file for marker in _LIBRARY_MARKERS)


@dataclass(frozen=True)
class RankStacks:
    rank: int
    snapshots: list[StackSnapshot]
    thread_id: int | None
    error: str | None = None  # why no stack could be read

    def training_frames(self, index: int = -1) -> list[Frame]:
        if not self.snapshots:
            return []
        thread = self.snapshots[index].thread(self.thread_id)
        return [] if thread is None else thread.frames

    def wait_point(self) -> Frame | None:
        """Where the training thread waits: its innermost program frame, else its innermost Python frame."""
        frames = self.training_frames()
        python = [f for f in frames if not f.native]
        return next((f for f in python if is_program_frame(f)), python[0] if python else None)

    def innermost(self) -> Frame | None:
        python = [f for f in self.training_frames() if not f.native]
        return python[0] if python else None

    def frozen_s(self) -> float | None:
        """Seconds over which the training thread's Python stack never changed (None: fewer than 2 snapshots or
        it changed)."""
        if len(self.snapshots) < 2:
            return None
        stacks = [[f for f in self.training_frames(i) if not f.native] for i in range(len(self.snapshots))]
        if any(s != stacks[0] for s in stacks[1:]):
            return None
        return self.snapshots[-1].wall_s - self.snapshots[0].wall_s


@dataclass(frozen=True)
class Culprit:
    rank: int
    frame: Frame | None
    innermost: Frame | None
    evidence: list[str]

    def to_dict(self) -> dict[str, Any]:
        where = None if self.frame is None else self.frame.where()
        return {
            "rank": self.rank,
            "where": where,
            "file": None if self.frame is None else self.frame.file,
            "line": None if self.frame is None else self.frame.line,
            "function": None if self.frame is None else self.frame.function,
            "innermost": None if self.innermost is None else str(self.innermost),
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class Verdict:
    summary: str
    culprits: list[Culprit]
    odd_ranks: list[int]  # alone in their wait point, by the stacks
    wait_points: dict[str, list[int]]  # "function (file:line)" -> ranks waiting there
    hang: HangReport
    stacks: dict[int, RankStacks]
    threshold_s: float

    @property
    def culprit_ranks(self) -> list[int]:
        return [c.rank for c in self.culprits]

    def to_dict(self, run_dir: str) -> dict[str, Any]:
        ranks: dict[str, Any] = {}
        for rank, stacks in sorted(self.stacks.items()):
            point = stacks.wait_point()
            ranks[str(rank)] = {
                "wait_point": None if point is None else str(point),
                "frozen_s": stacks.frozen_s(),
                "method": stacks.snapshots[-1].method if stacks.snapshots else None,
                "snapshots": len(stacks.snapshots),
                "error": stacks.error,
                "notes": sorted({n for s in stacks.snapshots for n in s.notes}),
                "frames": [str(f) for f in stacks.training_frames()],
            }
        return {
            "schema": VERDICT_SCHEMA,
            "schema_version": VERDICT_SCHEMA_VERSION,
            "deeptrace_version": __version__,
            "created": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "run_dir": run_dir,
            "threshold_s": self.threshold_s,
            "summary": self.summary,
            "culprit_ranks": self.culprit_ranks,
            "culprits": [c.to_dict() for c in self.culprits],
            "waiting_ranks": self.hang.waiting_ranks,
            "collective": None if self.hang.collective is None else self.hang.collective.model_dump(mode="json"),
            "odd_ranks": self.odd_ranks,
            "wait_points": self.wait_points,
            "ranks": ranks,
            "heartbeats": self.hang.to_dict(),
        }


def decide(hang: HangReport, stacks: dict[int, RankStacks], threshold_s: float) -> Verdict:
    points: dict[str, list[int]] = {}
    for rank, rank_stacks in sorted(stacks.items()):
        point = rank_stacks.wait_point()
        if point is not None:
            points.setdefault(str(point), []).append(rank)
    odd = _odd_ranks(points)
    named = hang.culprit_ranks or odd
    culprits = [_culprit(rank, hang, stacks.get(rank), points, odd) for rank in named]
    return Verdict(_summary(hang, culprits), culprits, odd, points, hang, stacks, threshold_s)


def _odd_ranks(points: dict[str, list[int]]) -> list[int]:
    """Ranks alone in their wait point while a majority shares another one."""
    if len(points) < 2:
        return []
    sizes = Counter({point: len(ranks) for point, ranks in points.items()})
    (_, biggest), *_ = sizes.most_common(1)
    if biggest < 2:
        return []
    return sorted(ranks[0] for point, ranks in points.items() if len(ranks) == 1)


def _culprit(
    rank: int, hang: HangReport, stacks: RankStacks | None, points: dict[str, list[int]], odd: list[int]
) -> Culprit:
    evidence = []
    state = hang.ranks.get(rank)
    if rank in hang.culprit_ranks:
        evidence.append(f"heartbeats: {hang.reason}")
    if state is not None:
        evidence.append(f"heartbeat: {state.status}, {state.where()}")
    if stacks is None or not stacks.snapshots:
        evidence.append(f"no stack: {stacks.error if stacks is not None else 'not captured'}")
        return Culprit(rank, None, None, evidence)
    point = stacks.wait_point()
    if point is not None:
        others = {p: rs for p, rs in points.items() if p != str(point)}
        if rank in odd and others:
            where, ranks = max(others.items(), key=lambda item: len(item[1]))
            evidence.append(f"stacks: the only rank in {point}; ranks {', '.join(map(str, ranks))} wait in {where}")
        else:
            evidence.append(f"stacks: waits in {point}")
    frozen = stacks.frozen_s()
    if frozen is not None:
        evidence.append(f"stacks: unchanged over {len(stacks.snapshots)} snapshots ({frozen:.1f} s)")
    elif len(stacks.snapshots) > 1:
        evidence.append("stacks: changed between snapshots (it moves, but makes no recorded progress)")
    return Culprit(rank, point, stacks.innermost(), evidence)


def _summary(hang: HangReport, culprits: list[Culprit]) -> str:
    if not culprits:
        return hang.summary() + " The stacks single out no rank either."
    named = []
    for c in culprits:
        text = f"rank {c.rank}"
        if c.frame is not None:
            text += f" at {c.frame.where()} in {c.frame.function}()"
        named.append(text)
    return f"{hang.summary()} Culprit: {'; '.join(named)}."
