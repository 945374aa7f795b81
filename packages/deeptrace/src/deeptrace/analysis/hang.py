"""Hang diagnosis from heartbeats: which ranks stopped, where, and which rank the others wait for.

Every rank's heartbeat (RUN_DIR/heartbeat/rank-{R}.json) says its last step, the innermost span it is inside, the
collective it last entered and left (group, per-group sequence number, name), when it last made progress and when
the file was last rewritten. From those alone:

- a rank is *stalled* when it made no progress for `stall_after_s` while its heartbeat thread still rewrites the
  file (the process lives, the training thread is blocked), *gone* when the file is not rewritten either (the
  process died or froze), *crashed* or *closed* when it said so on the way out;
- there is a hang when a rank is stalled, or was seen stalled before its process disappeared (its heartbeat
  kept being written for `stall_after_s` after its last progress), or crashed. Ranks that were all still
  progressing when their heartbeats stopped were killed (a time limit, a preemption): no hang;
- the ranks stopped inside the same collective (group, seq) *wait*; the ranks that never entered it (their last
  sequence number in that group is lower) are the ones they wait for, the *culprits*;
- with nobody inside a collective, the rank(s) whose step is behind are the culprits; a crashed or dead rank,
  or finally one whose heartbeat is missing, is next in line.

The answer is a HangReport (or None when there is no hang), whose `to_dict()` is report.json's `hang` key; each
rank's state in it is report.json's typed `HangRank` (report/model.py), its position read by `rundir.position`.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deeptrace.errors import TraceInputError
from deeptrace.report.model import HangCollective, HangRank, HangRankStatus
from deeptrace.rundir import layout, rank_position
from deeptrace.rundir.position import duration_text
from deeptrace.rundir.readers import read_heartbeats, read_meta
from deeptrace.rundir.records import Heartbeat
from deeptrace.rundir.writer import host_name

STOPPED: tuple[HangRankStatus, ...] = ("stalled", "gone", "crashed")

DEFAULT_STALL_AFTER_S = 120.0


@dataclass(frozen=True, slots=True)
class HangReport:
    """The diagnosis. `summary()` is one human paragraph; `to_dict()` is report.json's `hang` value."""

    now_wall_s: float
    stall_after_s: float
    world_size: int
    stopped_ranks: list[int]  # stalled, gone or crashed
    waiting_ranks: list[int]  # stopped inside the collective that the culprits never entered (or ahead of them)
    culprit_ranks: list[int]  # the ranks the others wait for
    collective: HangCollective | None  # what the waiting ranks are stuck in
    reason: str  # how the culprits were found
    ranks: dict[int, HangRank]
    evidence: list[str]
    missing_ranks: list[int] = field(default_factory=list)
    unreadable_ranks: dict[int, str] = field(default_factory=dict)

    def summary(self) -> str:
        culprits = _ranks_text(self.culprit_ranks)
        if self.collective is not None and self.waiting_ranks and self.culprit_ranks:
            where = "; ".join(f"rank {r}: {self.ranks[r].where()}" for r in self.culprit_ranks)
            step = self.ranks[self.waiting_ranks[0]].step
            at_step = f" at step {step}" if step is not None else ""
            return (
                f"Hang: {_ranks_text(self.waiting_ranks)} wait in {self.collective}{at_step} for {culprits}, "
                f"which never entered it ({where})."
            )
        if self.culprit_ranks:
            return f"Hang: {_ranks_text(self.stopped_ranks)} stopped; they wait for {culprits} ({self.reason})."
        return f"Hang: {_ranks_text(self.stopped_ranks)} stopped; no rank stands out as the one the others wait for."

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "now_wall_s": self.now_wall_s,
            "stall_after_s": self.stall_after_s,
            "world_size": self.world_size,
            "stopped_ranks": self.stopped_ranks,
            "waiting_ranks": self.waiting_ranks,
            "culprit_ranks": self.culprit_ranks,
            "collective": None if self.collective is None else self.collective.model_dump(mode="json"),
            "reason": self.reason,
            "missing_ranks": self.missing_ranks,
            "unreadable_ranks": {str(r): why for r, why in self.unreadable_ranks.items()},
            "evidence": self.evidence,
            "ranks": {str(r): s.model_dump(mode="json") for r, s in sorted(self.ranks.items())},
        }


def diagnose_hang(
    run_dir: Path | str, now_wall: float | None = None, stall_after_s: float = DEFAULT_STALL_AFTER_S
) -> HangReport | None:
    """Diagnose a hang from RUN_DIR's heartbeats; None when no rank has stopped (or no heartbeat exists).

    `now_wall` (Unix seconds, default now) is the moment judged; a rank idle for `stall_after_s` seconds counts as
    stopped. Missing and unreadable heartbeat files are reported in the result, never raised.
    """
    run_dir = Path(run_dir)
    now = time.time() if now_wall is None else now_wall
    errors: dict[int, TraceInputError] = {}
    heartbeats = read_heartbeats(run_dir, errors=errors)
    if not heartbeats and not errors:
        return None
    world_size = _world_size(run_dir, heartbeats, errors)
    states: dict[int, HangRank] = {}
    for rank in range(world_size):
        if rank in heartbeats:
            states[rank] = _rank_state(heartbeats[rank], now, stall_after_s)
        elif rank in errors:
            states[rank] = HangRank(rank=rank, status="unreadable", note=errors[rank].problem)
        else:
            states[rank] = HangRank(rank=rank, status="missing", note=f"no {layout.heartbeat_path(run_dir, rank)}")
    stopped = [r for r, s in states.items() if s.status in STOPPED]
    # A hang needs a rank seen alive without progress, or a crash. Ranks that were all still progressing when
    # their heartbeats stopped were killed (a time limit, a preemption): not a hang.
    if not any(s.stalled or s.status == "crashed" for s in states.values()):
        return None
    missing = [r for r, s in states.items() if s.status == "missing"]
    unreadable = {r: s.note or "" for r, s in states.items() if s.status == "unreadable"}
    collective, waiting, culprits, reason = _who_waits_for_whom(states, stopped)
    return HangReport(
        now_wall_s=now,
        stall_after_s=stall_after_s,
        world_size=world_size,
        stopped_ranks=stopped,
        waiting_ranks=waiting,
        culprit_ranks=culprits,
        collective=collective,
        reason=reason,
        ranks=states,
        evidence=_evidence(states, collective),
        missing_ranks=missing,
        unreadable_ranks=unreadable,
    )


def _world_size(run_dir: Path, heartbeats: dict[int, Heartbeat], errors: dict[int, TraceInputError]) -> int:
    candidates = [hb.world_size for hb in heartbeats.values()]
    candidates += [rank + 1 for rank in [*heartbeats, *errors]]
    # meta.json is optional for the diagnosis: the heartbeats carry the world size too.
    with contextlib.suppress(TraceInputError):
        candidates.append(read_meta(run_dir).world_size)
    return max(candidates)


def _rank_state(hb: Heartbeat, now: float, stall_after_s: float) -> HangRank:
    idle = max(0.0, now - hb.last_event_wall_s)
    age = max(0.0, now - hb.written_wall_s)
    # How long the process was seen alive (its heartbeat thread still writing) without making progress.
    idle_while_alive = max(0.0, hb.written_wall_s - hb.last_event_wall_s)
    note = None
    stalled = False
    if hb.state == "closed":
        status: HangRankStatus = "closed"
    elif hb.state == "crashed":
        status, note = "crashed", hb.error
    elif idle < stall_after_s:
        status = "progressing"
    elif age < stall_after_s and _process_alive(hb):
        status, stalled = "stalled", True
    else:
        status = "gone"
        stalled = idle_while_alive >= stall_after_s
        why = (
            f"heartbeat not rewritten for {duration_text(age)}"
            if age >= stall_after_s
            else f"process {hb.pid} no longer exists on {hb.host}"
        )
        if stalled:
            note = f"{why}; it had made no progress for {duration_text(idle_while_alive)} before that"
        else:
            note = f"{why}; it was still making progress until then (killed or died, not hung)"
    position = rank_position(hb)
    inside = position.collective
    return HangRank(
        rank=hb.rank,
        status=status,
        step=position.step,
        idle_s=idle,
        heartbeat_age_s=age,
        in_collective=None if inside is None else HangCollective(group=inside.group, seq=inside.seq, name=inside.name),
        open_span=position.span_label,
        open_span_s=position.inside_for_s(now),
        last_seq={group: entered for group, (entered, _) in hb.groups.items()},
        host=hb.host,
        pid=hb.pid,
        note=note,
        stalled=stalled,
    )


def _process_alive(hb: Heartbeat) -> bool:
    """Whether the heartbeat's process still exists; True when that cannot be known from here (another host)."""
    if hb.host != host_name():
        return True
    try:
        os.kill(hb.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


Verdict = tuple[HangCollective | None, list[int], list[int], str]


def _who_waits_for_whom(states: dict[int, HangRank], stopped: list[int]) -> Verdict:
    """(collective waited in, waiting ranks, culprit ranks, how the culprits were found)."""
    inside: dict[HangCollective, list[int]] = {}
    for rank in stopped:
        coll = states[rank].in_collective
        if coll is not None:
            inside.setdefault(coll, []).append(rank)
    if inside:
        # The collective most stopped ranks wait in; on a tie the earliest (lowest seq) one.
        collective, waiting = max(inside.items(), key=lambda item: (len(item[1]), -item[0].seq))
        return _waiting_in(collective, waiting, states)
    return _waiting_outside_collectives(states, stopped)


def _waiting_in(collective: HangCollective, waiting: list[int], states: dict[int, HangRank]) -> Verdict:
    """Ranks wait inside `collective`: the culprits are those that never entered it."""
    culprits = []
    for rank, state in states.items():
        if rank in waiting or state.status in ("missing", "unreadable", "closed"):
            continue
        last = state.last_seq.get(collective.group)
        if last is None or last < collective.seq:
            culprits.append(rank)
    if culprits:
        return collective, waiting, culprits, f"never entered {collective}"
    unknown = [r for r, s in states.items() if s.status in ("missing", "unreadable")]
    if unknown:
        return collective, waiting, unknown, "their heartbeat is missing or unreadable"
    return collective, waiting, [], "every rank with a heartbeat entered the collective"


def _waiting_outside_collectives(states: dict[int, HangRank], stopped: list[int]) -> Verdict:
    """Nobody is inside a collective: a dead rank, then the rank behind in steps, then a silent one."""
    dead = [r for r in stopped if states[r].status in ("crashed", "gone")]
    if dead and len(dead) < len(stopped):
        return None, [r for r in stopped if r not in dead], dead, "crashed or died while the others still run"
    steps = {r: step for r in stopped if (step := states[r].step) is not None}
    if len(set(steps.values())) > 1:
        behind = min(steps.values())
        culprits = [r for r, step in steps.items() if step == behind]
        waiting = [r for r in stopped if r not in culprits]
        return None, waiting, culprits, f"their step ({behind}) is behind the others'"
    unknown = [r for r, s in states.items() if s.status in ("missing", "unreadable")]
    if unknown:
        return None, stopped, unknown, "their heartbeat is missing or unreadable"
    return None, stopped, [], "every stopped rank is at the same step, outside any collective"


def _evidence(states: dict[int, HangRank], collective: HangCollective | None) -> list[str]:
    lines = []
    for rank, s in sorted(states.items()):
        text = f"rank {rank}: {s.status}"
        if s.status not in ("missing", "unreadable"):
            text += f", {s.where()}"
            if s.idle_s is not None:
                text += f", no progress for {duration_text(s.idle_s)}"
        if collective is not None and s.status not in ("missing", "unreadable"):
            last = s.last_seq.get(collective.group)
            text += f", last entered seq in group {collective.group}: {'none' if last is None else last}"
        if s.note:
            text += f" ({s.note})"
        lines.append(text)
    return lines


def _ranks_text(ranks: list[int]) -> str:
    if not ranks:
        return "no rank"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)
