"""Clock offsets between ranks (hosts), estimated from matched collectives.

A collective ends at nearly the same moment on every rank (nobody leaves before the last rank's data arrived),
so on two clocks the ends differ by the clocks' offset plus small noise. The estimate is robust to a straggler
(it changes starts, not ends) and to outliers: offset of rank r = median over collectives of (end on r − median
end over the collective's ranks), iterated so that one badly-off rank does not pull the median, then expressed
relative to the reference rank (the lowest rank). Corrected time = own time − offset.
"""

from __future__ import annotations

import numpy as np

from deeptrace.analysis.collectives import Matched


def estimate_offsets(matched: list[Matched], iterations: int = 5) -> dict[int, int]:
    """Offset in ns per rank (0 for the reference rank, and for ranks that share no collective)."""
    ranks = sorted({r for m in matched for r in m.times})
    if len(ranks) < 2:
        return dict.fromkeys(ranks, 0)
    offsets = dict.fromkeys(ranks, 0.0)
    for _ in range(iterations):
        residuals: dict[int, list[float]] = {r: [] for r in ranks}
        for m in matched:
            ends = {r: e - offsets[r] for r, (_, e) in m.times.items()}
            middle = float(np.median(list(ends.values())))
            for r, e in ends.items():
                residuals[r].append(e - middle)
        change = 0.0
        for r in ranks:
            if residuals[r]:
                step = float(np.median(residuals[r]))
                offsets[r] += step
                change = max(change, abs(step))
        if change < 1.0:  # below a nanosecond
            break
    reference = offsets[ranks[0]]
    return {r: round(o - reference) for r, o in offsets.items()}
