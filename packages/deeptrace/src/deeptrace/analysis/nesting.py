"""Exclusive (self) time of nested collector spans: a child's time belongs to the child.

The collector records nested spans of a thread on tracks `<thread>` (depth 0), `<thread>/1`, `<thread>/2`, ...
A blocking collective recorded inside a "forward" compute span means the thread waited for communication during
that time, not that compute overlapped it; so each non-communication span keeps only the time not covered by
deeper spans of its thread. Spans begun asynchronously (`<thread>/async-<k>` lanes) and explicit tracks nest
in nothing: they overlap what runs beside them, which is exactly what overlap measures. Communication spans are
never cut (they identify collectives across ranks), but they do cover their parents.
"""

from __future__ import annotations

import re
from collections import defaultdict

import numpy as np

from deeptrace.analysis import intervals as iv
from deeptrace.analysis.table import CODE, RankTable
from deeptrace.spans import Category

_NESTED = re.compile(r"^(?P<base>.+)/(?P<depth>\d+)$")


def _subtract(start: int, end: int, covered: tuple[iv.I64, iv.I64]) -> list[tuple[int, int]]:
    """[start, end) minus a merged set, as pieces."""
    cs, ce = covered
    pieces = []
    k = int(np.searchsorted(ce, start, side="right"))
    cursor = start
    while k < cs.size and cs[k] < end:
        if cs[k] > cursor:
            pieces.append((cursor, int(cs[k])))
        cursor = max(cursor, int(ce[k]))
        k += 1
    if cursor < end:
        pieces.append((cursor, end))
    return pieces


def exclusive_nesting(table: RankTable) -> RankTable:
    """The table with each nested non-communication span cut down to its self time (rows split or dropped)."""
    by_base: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for track_id, name in enumerate(table.tracks):
        nested = _NESTED.match(name)
        base, depth = (nested["base"], int(nested["depth"])) if nested else (name, 0)
        if "/async-" in name:
            continue
        by_base[base][depth].append(track_id)
    if all(len(depths) < 2 for depths in by_base.values()):
        return table  # nothing nests
    comm = CODE[Category.COMM]
    keep: list[int] = []  # row index per output row
    starts: list[int] = []
    ends: list[int] = []
    handled = np.zeros(len(table), dtype=bool)
    for depths in by_base.values():
        covered = (np.empty(0, np.int64), np.empty(0, np.int64))
        for depth in sorted(depths, reverse=True):
            rows = np.flatnonzero(np.isin(table.track, depths[depth]))
            handled[rows] = True
            for i in rows.tolist():
                s, e = int(table.start_ns[i]), int(table.end_ns[i])
                pieces = [(s, e)] if table.category[i] == comm or not covered[0].size else _subtract(s, e, covered)
                for ps, pe in pieces:
                    keep.append(i)
                    starts.append(ps)
                    ends.append(pe)
            covered = iv.union(covered, iv.merge(table.start_ns[rows], table.end_ns[rows]))
    for i in np.flatnonzero(~handled).tolist():
        keep.append(i)
        starts.append(int(table.start_ns[i]))
        ends.append(int(table.end_ns[i]))
    order = np.argsort(np.asarray(starts, np.int64), kind="stable")
    index = np.asarray(keep, np.int64)[order]
    table.start_ns = np.asarray(starts, np.int64)[order]
    table.end_ns = np.asarray(ends, np.int64)[order]
    for column in ("category", "track", "name_id", "step", "group_id", "seq", "in_window"):
        setattr(table, column, getattr(table, column)[index])
    if table.nbytes is not None:
        table.nbytes = table.nbytes[index]
    return table
