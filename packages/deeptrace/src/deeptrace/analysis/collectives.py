"""Collectives of each rank, matched across ranks, with arrival skew and who waited for whom.

A collective is identified across ranks by (process group, sequence number) when the input has one (collector
spans; NCCL metadata with a sequence number in newer Kineto traces); otherwise by its position among the
collectives of the same group within the same step (NCCL requires every rank of a communicator to issue the
same collectives in the same order, so the k-th of a group on one rank is the k-th on all).

Arrival is the start of the collective (a rank that arrives late makes the others wait inside theirs); the end
is near-simultaneous on all ranks, which is what `deeptrace.analysis.clock` uses to align clocks. Times given to
`measure_skew` must already be clock-corrected.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from deeptrace.analysis.table import CODE, NO_STEP, RankTable
from deeptrace.spans import Category

CollectiveKey = tuple[str, str, int, int]  # (group, "seq" | "order", step, seq or position)


@dataclass
class CollectiveLog:
    """One rank's collectives, in compact form (it travels from the worker process to the cross-rank step)."""

    rank: int
    keys: list[CollectiveKey] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    start_ns: list[int] = field(default_factory=list)
    end_ns: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.keys)


def collective_log(table: RankTable) -> CollectiveLog:
    """Every communication interval of a rank, keyed for matching."""
    log = CollectiveLog(rank=table.rank)
    rows = np.flatnonzero(table.category == CODE[Category.COMM])
    rows = rows[np.argsort(table.start_ns[rows], kind="stable")]
    position: dict[tuple[str, int], int] = defaultdict(int)
    for i in rows.tolist():
        gid = int(table.group_id[i])
        group = table.groups[gid] if gid >= 0 else table.tracks[int(table.track[i])]
        step = int(table.step[i])
        seq = int(table.seq[i])
        if seq >= 0:
            key: CollectiveKey = (group, "seq", NO_STEP, seq)
        else:
            k = position[(group, step)]
            position[(group, step)] = k + 1
            key = (group, "order", step, k)
        log.keys.append(key)
        log.names.append(table.names[int(table.name_id[i])])
        log.start_ns.append(int(table.start_ns[i]))
        log.end_ns.append(int(table.end_ns[i]))
        log.step.append(step)
    return log


@dataclass
class Matched:
    """One collective seen on several ranks: per rank its (start, end) on the rank's own clock."""

    key: CollectiveKey
    name: str
    step: int
    times: dict[int, tuple[int, int]]


def match_collectives(logs: dict[int, CollectiveLog]) -> list[Matched]:
    """Collectives present on at least two ranks, in order of their first start."""
    found: dict[CollectiveKey, Matched] = {}
    for rank, log in logs.items():
        for key, name, s, e, step in zip(log.keys, log.names, log.start_ns, log.end_ns, log.step, strict=True):
            m = found.get(key)
            if m is None:
                m = found[key] = Matched(key=key, name=name, step=step, times={})
            if rank not in m.times:  # a duplicate key on one rank keeps its first occurrence
                m.times[rank] = (s, e)
            if m.step == NO_STEP:
                m.step = step
    matched = [m for m in found.values() if len(m.times) >= 2]
    matched.sort(key=lambda m: min(s for s, _ in m.times.values()))
    return matched


@dataclass
class RankArrival:
    """How one rank arrived at the collectives it shared with others."""

    collectives: int = 0
    last: int = 0
    caused_wait_ns: int = 0  # others' waiting at the collectives this rank arrived last at
    waited_ns: int = 0  # this rank's own waiting for a later rank
    lateness_ns: list[int] = field(default_factory=list)  # when last: start minus the median start of the others

    @property
    def last_share(self) -> float:
        return self.last / self.collectives if self.collectives else 0.0


@dataclass
class SkewResult:
    per_rank: dict[int, RankArrival]
    skew_ns: list[int]  # per matched collective: latest minus earliest (corrected) start
    last_rank: list[int]
    durations_ns: list[int]  # per matched collective: median duration over its ranks
    labels: list[dict[str, object]]  # per matched collective: group, step, name, how it was matched
    # per step: rank → waiting it caused others in that step
    caused_by_step: dict[int, dict[int, int]]


def measure_skew(matched: list[Matched], offsets_ns: dict[int, int]) -> SkewResult:
    """Arrival skew of each matched collective after subtracting each rank's clock offset."""
    per_rank: dict[int, RankArrival] = defaultdict(RankArrival)
    skews, lasts, durations = [], [], []
    labels: list[dict[str, object]] = []
    caused_by_step: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for m in matched:
        starts = {r: s - offsets_ns.get(r, 0) for r, (s, _) in m.times.items()}
        last = max(starts, key=lambda r: (starts[r], r))
        latest = starts[last]
        others = [v for r, v in starts.items() if r != last]
        caused = sum(latest - v for v in others)
        for r, v in starts.items():
            arrival = per_rank[r]
            arrival.collectives += 1
            if r != last:
                arrival.waited_ns += latest - v
        arrival = per_rank[last]
        arrival.last += 1
        arrival.caused_wait_ns += caused
        arrival.lateness_ns.append(int(latest - np.median(others)))
        caused_by_step[m.step][last] += caused
        skews.append(latest - min(starts.values()))
        lasts.append(last)
        durations.append(int(np.median([e - s for s, e in m.times.values()])))
        group, how, _, position = m.key
        labels.append({"group": group, "step": None if m.step == NO_STEP else m.step, "name": m.name[:120],
                       "matched_by": how, how: position})  # fmt: skip
    return SkewResult(
        per_rank=dict(per_rank),
        skew_ns=skews,
        last_rank=lasts,
        durations_ns=durations,
        labels=labels,
        caused_by_step={k: dict(v) for k, v in caused_by_step.items()},
    )
