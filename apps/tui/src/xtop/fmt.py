"""Short, fixed-width renderings of numbers for the screens: durations, sizes, rates, sparklines."""

from __future__ import annotations

import math

GIB = 1024**3
_BLOCKS = "▁▂▃▄▅▆▇█"


def duration(seconds: float | None) -> str:
    """3s, 4m05s, 2h07m, 3d04h; '-' when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def gib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / GIB:.2f} GiB"


def number(value: float | None, digits: int = 4) -> str:
    """A compact number: 3 significant digits by default, k/M suffixes for big ones."""
    if value is None or not math.isfinite(value):
        return "-"
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.{max(digits - 2, 1)}g}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.{max(digits - 1, 1)}g}k"
    return f"{value:.{digits}g}"


def sparkline(values: list[float], width: int, low: float | None = None, high: float | None = None) -> str:
    """The last `width` values as block characters, scaled to [low, high] (default: their own range)."""
    shown = values[-width:] if width > 0 else []
    if not shown:
        return ""
    lo = min(shown) if low is None else low
    hi = max(shown) if high is None else high
    span = hi - lo
    if span <= 0:
        return _BLOCKS[0] * len(shown)
    top = len(_BLOCKS) - 1
    return "".join(_BLOCKS[min(top, max(0, round((v - lo) / span * top)))] for v in shown)


def bar(fraction: float | None, width: int) -> str:
    """A horizontal bar of `width` cells filled to `fraction` (0–1)."""
    if fraction is None or width <= 0:
        return " " * max(width, 0)
    filled = round(min(1.0, max(0.0, fraction)) * width)
    return "█" * filled + "░" * (width - filled)
