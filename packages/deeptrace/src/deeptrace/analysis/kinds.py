"""Exposed communication per kind of collective (all-gather, reduce-scatter, all-reduce, all-to-all) and, where
the collector's span names say so, per purpose (FSDP parameter gather, gradient reduce-scatter, ...).

The claims a training setup rests on are about specific collectives (longer packs hide FSDP's all-gather,
Domino-EP hides the all-to-all), so one exposed figure for all communication cannot test them. A kind's exposed
time is the time some collective of that kind runs while no compute runs: the union of that kind's intervals
minus the union of compute, the same definition as the overall exposed communication. Two kinds running at the
same time both count that time, so the kinds' exposed times may add up to more than the overall figure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from deeptrace.analysis import intervals as iv
from deeptrace.analysis.table import CODE, RankTable
from deeptrace.spans import Category

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "p2p", "other")
# Letters only, lower case: 'ncclDevKernel_AllGather_RING_LL', 'gloo:all_gather', 'all_gather' all read
# 'allgather'. all-to-all before p2p: NCCL runs an all-to-all as SendRecv kernels, but names that say
# all-to-all mean it.
_KIND_WORDS = (
    ("allgather", "all_gather"),
    ("reducescatter", "reduce_scatter"),
    ("allreduce", "all_reduce"),
    ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"),
    ("sendrecv", "p2p"),
    ("send", "p2p"),
    ("recv", "p2p"),
)
# Purposes the collector's span (or group) names reveal. The first rule whose kind matches and whose words all
# appear in "name group" (lower case) wins.
PURPOSES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("fsdp_param_gather", "all_gather", ("param",)),
    ("fsdp_param_gather", "all_gather", ("unshard",)),
    ("fsdp_param_gather", "all_gather", ("fsdp",)),
    ("grad_reduce_scatter", "reduce_scatter", ("grad",)),
    ("grad_reduce_scatter", "reduce_scatter", ("fsdp",)),
    ("hsdp_all_reduce", "all_reduce", ("hsdp",)),
    ("hsdp_all_reduce", "all_reduce", ("replicate",)),
    ("ep_dispatch", "all_to_all", ("dispatch",)),
    ("ep_combine", "all_to_all", ("combine",)),
)
_NOT_LETTERS = re.compile(r"[^a-z]")


def collective_kind(name: str) -> str:
    """The kind of a collective from its kernel, annotation or span name; 'other' when none says."""
    letters = _NOT_LETTERS.sub("", name.lower())
    for word, kind in _KIND_WORDS:
        if word in letters:
            return kind
    return "other"


def collective_purpose(name: str, group: str | None) -> str | None:
    """What a collector collective is for, when its name or group says; None otherwise."""
    text = f"{name} {group or ''}".lower()
    kind = collective_kind(name)
    for purpose, wanted, words in PURPOSES:
        if kind == wanted and all(w in text for w in words):
            return purpose
    return None


@dataclass(frozen=True)
class KindFigures:
    """One kind (or purpose) of collective in one window; times in ns, bytes -1 when the input never says."""

    count: int
    nbytes: int
    total_ns: int
    exposed_ns: int


def _figures(table: RankTable, rows: npt.NDArray[np.int64], compute: tuple[iv.I64, iv.I64]) -> KindFigures:
    merged = iv.merge(table.start_ns[rows], table.end_ns[rows])
    total = iv.total(merged)
    known = table.nbytes[rows] if table.nbytes is not None else np.empty(0, np.int64)
    known = known[known >= 0]
    return KindFigures(
        count=int(rows.size),
        nbytes=int(known.sum()) if known.size else -1,
        total_ns=total,
        exposed_ns=total - iv.intersection(merged, compute),
    )


def kind_figures(
    table: RankTable, window: npt.NDArray[np.bool_]
) -> tuple[dict[str, KindFigures], dict[str, KindFigures]]:
    """Per kind and per purpose, the collectives among the rows in `window` (a step, or the analysis window)."""
    comm = np.flatnonzero(window & (table.category == CODE[Category.COMM]))
    pick = window & (table.category == CODE[Category.COMPUTE])
    compute = iv.merge(table.start_ns[pick], table.end_ns[pick])
    kind_of = [collective_kind(n) for n in table.names]
    kinds = np.asarray([kind_of[i] for i in table.name_id[comm].tolist()], dtype=object)
    by_kind = {k: _figures(table, comm[kinds == k], compute) for k in KINDS if (kinds == k).any()}
    by_purpose: dict[str, KindFigures] = {}
    if table.source == "collector" and comm.size:
        groups = table.group_id[comm]
        purposes = np.asarray(
            [
                collective_purpose(table.names[n], table.groups[g] if g >= 0 else None)
                for n, g in zip(table.name_id[comm].tolist(), groups.tolist(), strict=True)
            ],
            dtype=object,
        )
        for purpose in dict.fromkeys(p for p, _, _ in PURPOSES):
            chosen = comm[purposes == purpose]
            if chosen.size:
                by_purpose[purpose] = _figures(table, chosen, compute)
    return by_kind, by_purpose


@dataclass(frozen=True)
class RankKinds:
    """A rank's per-kind and per-purpose figures: over the analysis window, and per complete step."""

    kinds: dict[str, KindFigures]
    purposes: dict[str, KindFigures]
    steps: dict[int, tuple[dict[str, KindFigures], dict[str, KindFigures]]]

    def exposed_ns_per_step(self, kind: str, purposes: bool = False) -> float | None:
        """Mean over the complete steps of the kind's (or purpose's) exposed time; None without steps."""
        if not self.steps:
            return None
        return float(np.mean([(s[1] if purposes else s[0]).get(kind, _NONE).exposed_ns for s in self.steps.values()]))


_NONE = KindFigures(count=0, nbytes=-1, total_ns=0, exposed_ns=0)


def rank_kinds(table: RankTable) -> RankKinds:
    """Per-kind figures of one rank, with the same windows as its breakdown (analysis/breakdown.py)."""
    kinds, purposes = kind_figures(table, table.in_window)
    steps = {}
    for step in table.complete_steps:
        rows = table.step == step
        if rows.any():
            steps[step] = kind_figures(table, rows)
    return RankKinds(kinds=kinds, purposes=purposes, steps=steps)
