"""A line chart drawn with braille characters: each cell holds 2×4 dots, so a 30×6 cell chart shows 60 points
at 24 levels. Drawing cost depends on the chart's size and the (bounded) series, never on the run's length."""

from __future__ import annotations

import itertools
import math

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from xtop.fmt import number
from xtop.series import DecimatedSeries

_BRAILLE_BASE = 0x2800
# Dot bits of a braille cell, indexed [row][column] with row 0 at the top.
_DOT = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
LABEL_WIDTH = 7


def braille_plot(ys: list[float], width: int, height: int) -> tuple[list[str], float, float]:
    """Rows of braille text (top first) plotting `ys` across `width` cells, and the value range shown."""
    columns, rows = width * 2, height * 4
    if not ys or columns <= 0 or rows <= 0:
        return [" " * max(width, 0)] * max(height, 0), 0.0, 0.0
    # One value per dot column: the mean of the points falling into it; a short series is spread across the
    # whole width (point i at column i * (columns - 1) / (n - 1)), joined by the vertical runs below.
    n = len(ys)
    samples: list[float | None] = [None] * columns
    if n >= columns:
        for column in range(columns):
            chunk = ys[column * n // columns : max(column * n // columns + 1, (column + 1) * n // columns)]
            samples[column] = sum(chunk) / len(chunk)
    else:
        for index, value in enumerate(ys):
            samples[round(index * (columns - 1) / max(1, n - 1))] = value
    known = [value for value in samples if value is not None]
    low, high = min(known), max(known)
    span = high - low if high > low else 1.0
    grid = [[0] * width for _ in range(height)]

    def level(value: float) -> int:
        return rows - 1 - round((value - low) / span * (rows - 1))

    # Dots at each sample, columns between two samples filled by linear interpolation, and a vertical run from
    # each column's level to the next one's, so a steep change reads as a line rather than scattered dots.
    points = [(column, level(value)) for column, value in enumerate(samples) if value is not None]
    levels: dict[int, int] = {}
    for (c0, r0), (c1, r1) in itertools.pairwise(points):
        for column in range(c0, c1 + 1):
            levels[column] = round(r0 + (r1 - r0) * (column - c0) / (c1 - c0))
    if len(points) == 1:
        levels[points[0][0]] = points[0][1]
    previous: int | None = None
    for column in sorted(levels):
        row = levels[column]
        top, bottom = (row, row) if previous is None else (min(previous, row), max(previous, row))
        for r in range(top, bottom + 1):
            grid[r // 4][column // 2] |= _DOT[r % 4][column % 2]
        previous = row
    lines = ["".join(chr(_BRAILLE_BASE + bits) if bits else " " for bits in row) for row in grid]
    return lines, low, high


class LineChart(Widget):
    """A titled chart of one series, with its range and newest value."""

    DEFAULT_CSS = """
    LineChart { width: 1fr; height: 1fr; min-height: 4; border: round $panel-lighten-2; padding: 0 0; }
    """
    version: reactive[int] = reactive(0)

    def __init__(self, title: str, *, id: str | None = None, style: str = "cyan") -> None:
        super().__init__(id=id)
        self.title = title
        self.series = DecimatedSeries()
        self.style = style
        self.border_title = title

    def show(self, series: DecimatedSeries) -> None:
        self.series = series
        self.border_subtitle = f"last {number(series.last)}" if series.last is not None else "no data"
        self.version += 1  # the series object may be the same one, grown: force a repaint

    def render(self) -> Text:
        width = max(1, self.size.width - LABEL_WIDTH)
        height = max(1, self.size.height)
        _, ys = self.series.points()
        if not ys:
            return Text("waiting for data", style="dim")
        lines, low, high = braille_plot(ys, width, height)
        text = Text(no_wrap=True, overflow="crop")
        for index, line in enumerate(lines):
            label = number(high) if index == 0 else number(low) if index == height - 1 else ""
            text.append(f"{label:>{LABEL_WIDTH - 1}} ", style="dim")
            text.append(line, style=self.style)
            if index < height - 1:
                text.append("\n")
        return text


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
