"""A numeric series of bounded size for the terminal charts.

A chart is at most a few hundred columns wide, so a run of a million steps is kept as at most `2 × capacity`
points: when the series fills up, neighbouring pairs merge into their mean (and the points that follow are
averaged in pairs too). Appending stays O(1) amortised and drawing costs the same for a short run and a long one.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, replace


@dataclass
class DecimatedSeries:
    capacity: int = 512
    xs: list[float] = field(default_factory=list)
    ys: list[float] = field(default_factory=list)
    stride: int = 1  # raw points per stored point
    _pending: list[tuple[float, float]] = field(default_factory=list)
    last: float | None = None
    count: int = 0

    def append(self, x: float, y: float | None) -> None:
        if y is None or not math.isfinite(y):
            return  # a skipped step (null loss) leaves a gap rather than a spike
        self.last = y
        self.count += 1
        self._pending.append((x, y))
        if len(self._pending) < self.stride:
            return
        self.xs.append(sum(p[0] for p in self._pending) / len(self._pending))
        self.ys.append(sum(p[1] for p in self._pending) / len(self._pending))
        self._pending = []
        if len(self.xs) >= 2 * self.capacity:
            self.xs = [(self.xs[i] + self.xs[i + 1]) / 2 for i in range(0, len(self.xs), 2)]
            self.ys = [(self.ys[i] + self.ys[i + 1]) / 2 for i in range(0, len(self.ys), 2)]
            self.stride *= 2

    def drop_after(self, x: float) -> None:
        """Forget the points after `x` (a resumed run logs those steps again). A stored point that merged raw
        points on both sides of `x` stays."""
        stored = bisect.bisect_right(self.xs, x)
        pending = [p for p in self._pending if p[0] <= x]
        self.count -= (len(self.xs) - stored) * self.stride + len(self._pending) - len(pending)
        del self.xs[stored:], self.ys[stored:]
        self._pending = pending
        self.last = pending[-1][1] if pending else self.ys[-1] if self.ys else None

    def copy(self) -> DecimatedSeries:
        """An independent copy: appending to either leaves the other as it was."""
        return replace(self, xs=list(self.xs), ys=list(self.ys), _pending=list(self._pending))

    def points(self) -> tuple[list[float], list[float]]:
        """Stored points plus the not yet merged tail, so the newest value always shows."""
        if not self._pending:
            return self.xs, self.ys
        return self.xs + [p[0] for p in self._pending], self.ys + [p[1] for p in self._pending]


@dataclass
class History:
    """The last `size` samples of a gauge (for sparklines), oldest first."""

    size: int = 60
    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.values.append(value)
        if len(self.values) > self.size:
            del self.values[0]
