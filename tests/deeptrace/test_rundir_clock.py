"""Clock references: the tightest of several wall/monotonic samples is kept."""

from __future__ import annotations

import time

import pytest
from deeptrace.rundir import ClockRef


def test_measure_keeps_the_tightest_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    # Three samples of (monotonic, wall, monotonic): widths 50, 4 and 30 ns. The second is the tightest.
    monotonic = iter([1000, 1050, 2000, 2004, 3000, 3030])
    wall = iter([10_000, 20_000, 30_000])
    monkeypatch.setattr(time, "monotonic_ns", lambda: next(monotonic))
    monkeypatch.setattr(time, "time_ns", lambda: next(wall))
    ref = ClockRef.measure(samples=3)
    assert ref == ClockRef(wall_ns=20_000, mono_ns=2002, uncertainty_ns=4)
    assert ref.to_wall_ns(2102) == 20_100


def test_measure_on_the_real_clocks_agrees_with_an_independent_reading() -> None:
    ref = ClockRef.measure()
    assert ref.uncertainty_ns >= 0
    assert abs(ref.to_wall_ns(time.monotonic_ns()) - time.time_ns()) < 5_000_000
