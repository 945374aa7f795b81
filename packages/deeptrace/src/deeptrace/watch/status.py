"""The live verdict of `deeptrace watch`: each rank progressing, slow, in an announced phase, or stuck.

- **stuck**: no progress for the threshold while others progress, or no rank progressing at all (the heartbeat
  diagnosis of `deeptrace.analysis.hang`, which also says who the others wait for);
- **phase**: inside a phase the training loop announced (`Collector.phase("checkpoint")`): never an alarm, and
  neither are the ranks that wait in a collective while some rank is in a phase (they wait for it);
- **slow**: it arrives last at most of the recent collectives that every rank reached, by a clear margin
  (`SlowConfig`), or, without collectives, its steps take clearly longer than the others'.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from deeptrace.analysis.hang import HangReport, diagnose_hang
from deeptrace.errors import TraceInputError
from deeptrace.rundir import rank_position, read_heartbeats
from deeptrace.rundir.records import Heartbeat
from deeptrace.watch.follow import RankTrace

Overall = Literal["healthy", "slow", "hung", "finished", "waiting"]
RankState = Literal[
    "progressing", "slow", "phase", "waiting", "stuck", "closed", "crashed", "gone", "missing", "unreadable"
]


@dataclass(frozen=True)
class SlowConfig:
    min_collectives: int = 8  # recent collectives reached by every rank needed before judging
    last_share: float = 0.6  # arrives last at this share of them or more ...
    min_lateness_ms: float = 5.0  # ... by at least this much (median) ...
    min_lateness_of_step: float = 0.05  # ... and this share of the median step time
    step_ratio: float = 1.25  # without collectives: a median step this much longer than the others'


@dataclass(frozen=True)
class SlowRank:
    rank: int
    lateness_ms: float  # median, at the collectives where it arrived last; or the extra step time
    evidence: str


@dataclass(frozen=True)
class RankView:
    rank: int
    state: RankState
    step: int | None
    where: str
    idle_s: float | None
    note: str = ""


@dataclass
class RunStatus:
    overall: Overall
    ranks: list[RankView]
    slow: list[SlowRank] = field(default_factory=list)
    hang: HangReport | None = None  # set when overall == "hung"
    message: str = ""


def judge(
    run_dir: Path, traces: dict[int, RankTrace], threshold_s: float, now: float, slow: SlowConfig | None = None
) -> RunStatus:
    unreadable: dict[int, TraceInputError] = {}
    heartbeats = read_heartbeats(run_dir, errors=unreadable)
    if not heartbeats:
        return _no_heartbeat(unreadable)
    report = diagnose_hang(run_dir, now_wall=now, stall_after_s=threshold_s)
    in_phase = {r for r, hb in heartbeats.items() if hb.phase is not None and hb.state == "running"}
    slow_ranks = find_slow(traces, slow or SlowConfig())
    last_arrival, furthest_left = _last_arrivals(heartbeats), _furthest_left(heartbeats)
    views = [
        _view(
            r, hb, report=report, in_phase=in_phase, slow=slow_ranks, now=now, threshold_s=threshold_s,
            last_arrival=last_arrival, furthest_left=furthest_left,
        )
        for r, hb in heartbeats.items()
    ]  # fmt: skip
    for rank, error in unreadable.items():  # cut off (a node that died mid-copy), or not a heartbeat
        views.append(RankView(rank, "unreadable", None, "heartbeat unreadable", None, str(error)))
    if report is not None:
        for rank in report.missing_ranks:
            views.append(RankView(rank, "missing", None, "no heartbeat file", None))
    views.sort(key=lambda v: v.rank)
    stuck = [v for v in views if v.state in ("stuck", "crashed")]
    if report is not None and stuck:
        return RunStatus("hung", views, list(slow_ranks.values()), report, report.summary())
    if all(hb.state == "closed" for hb in heartbeats.values()) and not unreadable:
        return RunStatus("finished", views, message="every rank closed its Collector")
    if all(v.state in ("closed", "gone", "unreadable") for v in views) and len(views) > len(unreadable):
        # Killed while progressing (a time limit, a preemption, Ctrl-C): over, and not a hang.
        return RunStatus("finished", views, message="every rank closed or gone (killed while progressing: no hang)")
    if slow_ranks:
        text = "; ".join(s.evidence for s in slow_ranks.values())
        return RunStatus("slow", views, list(slow_ranks.values()), message=text)
    phases = [f"rank {r} in phase '{phase.name}'" for r in sorted(in_phase) if (phase := heartbeats[r].phase)]
    return RunStatus("healthy", views, message="; ".join(phases) if phases else "every rank progressing")


def _no_heartbeat(unreadable: dict[int, TraceInputError]) -> RunStatus:
    if unreadable:
        problems = "; ".join(str(error) for _, error in sorted(unreadable.items()))
        return RunStatus("waiting", [], message=f"no readable heartbeat: {problems}")
    return RunStatus("waiting", [], message="no heartbeat yet (the run has not started its Collector)")


def _view(  # noqa: PLR0911  # one return per state, in the order the states take precedence
    rank: int,
    hb: Heartbeat,
    *,
    report: HangReport | None,
    in_phase: set[int],
    slow: dict[int, SlowRank],
    now: float,
    threshold_s: float,
    last_arrival: dict[tuple[str, int], float],
    furthest_left: dict[str, int],
) -> RankView:
    idle = max(0.0, now - hb.last_event_wall_s)
    state_of = report.ranks.get(rank) if report is not None else None
    where = rank_position(hb).describe(now)
    if hb.state == "closed":
        return RankView(rank, "closed", hb.step, where, idle)
    if hb.state == "crashed":
        return RankView(rank, "crashed", hb.step, where, idle, hb.error or "")
    if hb.phase is not None:
        return RankView(rank, "phase", hb.step, where, idle, f"in announced phase '{hb.phase.name}' for "
                        f"{now - hb.phase.since_wall_s:.1f} s")  # fmt: skip
    if state_of is None and now - hb.written_wall_s > threshold_s:
        return RankView(
            rank, "gone", hb.step, where, idle, f"heartbeat not rewritten for {now - hb.written_wall_s:.0f} s"
        )
    stopped = state_of is not None and state_of.status in ("stalled", "gone")
    if stopped and in_phase and hb.in_collective is not None:
        # It waits in a collective for a rank that is busy in an announced phase: not stuck.
        return RankView(rank, "waiting", hb.step, where, idle, f"waits for rank(s) {sorted(in_phase)} in a phase")
    inside = hb.in_collective
    if stopped and inside is not None and now - last_arrival[(inside.group, inside.seq)] < threshold_s:
        # A rank entered this collective only lately (e.g. it just left an announced phase that the others waited
        # for): the wait that counts starts at that arrival, not at this rank's own.
        since = now - last_arrival[(inside.group, inside.seq)]
        return RankView(rank, "waiting", hb.step, where, idle, f"the last rank entered {inside.name} {since:.1f} s ago")
    if stopped and inside is not None and furthest_left.get(inside.group, -1) >= inside.seq:
        # Another rank has left this very collective, so it completed: this rank's heartbeat is behind (its writer
        # thread has not run since), not the rank. Seen just after a long phase, when the others' steps run fast.
        return RankView(rank, "progressing", hb.step, where, idle,
                        f"heartbeat behind: other ranks have left {inside.name} (seq {inside.seq})")  # fmt: skip
    if stopped:
        assert state_of is not None
        return RankView(rank, "gone" if state_of.status == "gone" else "stuck", hb.step, where, idle,
                        state_of.note or "")  # fmt: skip
    if rank in slow:
        return RankView(rank, "slow", hb.step, where, idle, slow[rank].evidence)
    return RankView(rank, "progressing", hb.step, where, idle)


def _last_arrivals(heartbeats: dict[int, Heartbeat]) -> dict[tuple[str, int], float]:
    """For each collective some rank is inside, when the latest of those ranks entered it (Unix seconds)."""
    latest: dict[tuple[str, int], float] = {}
    for hb in heartbeats.values():
        if (inside := hb.in_collective) is not None:
            key = (inside.group, inside.seq)
            latest[key] = max(latest.get(key, inside.wall_s), inside.wall_s)
    return latest


def _furthest_left(heartbeats: dict[int, Heartbeat]) -> dict[str, int]:
    """For each group, the highest sequence number some rank has left."""
    furthest: dict[str, int] = {}
    for hb in heartbeats.values():
        for group, (_entered, left) in hb.groups.items():
            if left is not None:
                furthest[group] = max(furthest.get(group, left), left)
    return furthest


def find_slow(traces: dict[int, RankTrace], config: SlowConfig) -> dict[int, SlowRank]:
    """The ranks that arrive last at most recent collectives by a clear margin; without collectives, by steps."""
    if len(traces) < 2:
        return {}
    step_ms = _median_step_ms(traces)
    by_key: dict[tuple[str, int], dict[int, int]] = {}
    for rank, trace in traces.items():
        for a in trace.arrivals:
            by_key.setdefault((a.group, a.seq), {})[rank] = a.start_wall_ns
    complete = [starts for starts in by_key.values() if len(starts) == len(traces)]
    if len(complete) >= config.min_collectives:
        return _late_arrivers(complete, step_ms, config)
    return _slow_steps(traces, config)


def _median_step_ms(traces: dict[int, RankTrace]) -> float | None:
    durations = [(s.end_wall_ns - s.start_wall_ns) / 1e6 for t in traces.values() for s in t.steps]
    return statistics.median(durations) if durations else None


def _late_arrivers(complete: list[dict[int, int]], step_ms: float | None, config: SlowConfig) -> dict[int, SlowRank]:
    last_count: dict[int, int] = {}
    lateness: dict[int, list[float]] = {}
    for starts in complete:
        last = max(starts, key=lambda r: starts[r])
        others = [t for r, t in starts.items() if r != last]
        last_count[last] = last_count.get(last, 0) + 1
        lateness.setdefault(last, []).append((starts[last] - statistics.median(others)) / 1e6)
    floor = max(config.min_lateness_ms, config.min_lateness_of_step * (step_ms or 0.0))
    found = {}
    for rank, count in last_count.items():
        share = count / len(complete)
        late = statistics.median(lateness[rank])
        if share >= config.last_share and late >= floor:
            found[rank] = SlowRank(
                rank,
                late,
                f"rank {rank} slow: arrived last at {count} of the last {len(complete)} collectives, "
                f"{late:.1f} ms after the others (median)"
                + (f"; steps take {step_ms:.1f} ms" if step_ms is not None else ""),
            )
    return found


def _slow_steps(traces: dict[int, RankTrace], config: SlowConfig) -> dict[int, SlowRank]:
    medians = {
        r: statistics.median((s.end_wall_ns - s.start_wall_ns) / 1e6 for s in t.steps)
        for r, t in traces.items()
        if len(t.steps) >= config.min_collectives
    }
    if len(medians) < 2:
        return {}
    found = {}
    for rank, mine in medians.items():
        others = statistics.median(v for r, v in medians.items() if r != rank)
        if mine >= config.step_ratio * others and mine - others >= config.min_lateness_ms:
            found[rank] = SlowRank(
                rank, mine - others, f"rank {rank} slow: its steps take {mine:.1f} ms, the others' {others:.1f} ms"
            )
    return found
