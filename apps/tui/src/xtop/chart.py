"""A line chart drawn with braille characters: each cell holds 2×4 dots, so a 30×6 cell chart shows 60 points
at 24 levels. Drawing cost depends on the chart's size and the (bounded) series, never on the run's length.

A chart draws one series, optionally a second one over it on the same axes (the loss and the eval loss), and
marks: steps shown as a tinted column (a resume, a skipped step). Points are placed by their x (the step), so
a sparse series (an evaluation every 100 steps) lines up with a dense one."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from xtop.fmt import number
from xtop.series import DecimatedSeries

_BRAILLE_BASE = 0x2800
# Dot bits of a braille cell, indexed [row][column] with row 0 at the top.
_DOT = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
LABEL_WIDTH = 7

Curve = tuple[Sequence[float], Sequence[float]]
"""(xs, ys) of one series, xs ascending."""


@dataclass(frozen=True)
class Mark:
    """A step to point out on a chart: its cell column gets the background `style`."""

    x: float
    style: str


def dot_columns(
    xs: Sequence[float], ys: Sequence[float], columns: int, x_low: float, x_high: float
) -> list[float | None]:
    """One value per dot column: the mean of the points whose x falls into it (None where none does). x_low is
    the first column, x_high the last."""
    sums, counts = [0.0] * columns, [0] * columns
    span = x_high - x_low
    for x, y in zip(xs, ys, strict=True):
        column = round((x - x_low) / span * (columns - 1)) if span > 0 else 0
        column = min(columns - 1, max(0, column))
        sums[column] += y
        counts[column] += 1
    return [total / count if count else None for total, count in zip(sums, counts, strict=True)]


def dot_grid(samples: list[float | None], width: int, height: int, low: float, high: float) -> list[list[int]]:
    """The braille bits of each cell (rows top first) drawing `samples`, one per dot column, between low and
    high: a dot at each sample, the columns between two samples filled by linear interpolation, and a vertical run
    from each column's level to the next one's, so a steep change reads as a line rather than scattered dots."""
    rows = height * 4
    span = high - low if high > low else 1.0
    grid = [[0] * width for _ in range(height)]

    def level(value: float) -> int:
        return rows - 1 - round((value - low) / span * (rows - 1))

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
    return grid


def braille_plot(
    curves: Sequence[Curve], width: int, height: int
) -> tuple[list[list[list[int]]], float, float, float, float]:
    """Each curve's cell bits on shared axes, and the ranges shown: (grids, y low, y high, x low, x high)."""
    shown = [(xs, ys) for xs, ys in curves if ys]
    if not shown or width <= 0 or height <= 0:
        return [[[0] * max(width, 0) for _ in range(max(height, 0))] for _ in curves], 0.0, 0.0, 0.0, 0.0
    x_low, x_high = min(xs[0] for xs, _ in shown), max(xs[-1] for xs, _ in shown)
    samples = [dot_columns(xs, ys, width * 2, x_low, x_high) if ys else [] for xs, ys in curves]
    known = [value for column in samples for value in column if value is not None]
    low, high = min(known), max(known)
    grids = [dot_grid(column, width, height, low, high) for column in samples]
    return grids, low, high, x_low, x_high


class LineChart(Widget):
    """A titled chart of a series (and optionally a second one over it), with its range and newest values."""

    DEFAULT_CSS = """
    LineChart { width: 1fr; height: 1fr; min-height: 4; border: round $panel-lighten-2; padding: 0 0; }
    """
    version: reactive[int] = reactive(0)

    def __init__(
        self, title: str, *, id: str | None = None, style: str = "cyan", overlay_title: str | None = None,
        overlay_style: str = "yellow",
    ) -> None:  # fmt: skip
        super().__init__(id=id)
        self.title = title
        self.series = DecimatedSeries()
        self.overlay: DecimatedSeries | None = None
        self.marks: tuple[Mark, ...] = ()
        self.style = style
        self.overlay_title = overlay_title
        self.overlay_style = overlay_style
        self.border_title = title

    def show(self, series: DecimatedSeries, overlay: DecimatedSeries | None = None, marks: Sequence[Mark] = ()) -> None:
        self.series, self.overlay, self.marks = series, overlay, tuple(marks)
        subtitle = f"last {number(series.last)}" if series.last is not None else "no data"
        if self.overlay_title is not None:
            has_overlay = overlay is not None and overlay.last is not None
            self.border_title = f"[{self.style}]{self.title}[/]" + (
                f" · [{self.overlay_style}]{self.overlay_title}[/]" if has_overlay else ""
            )
            if overlay is not None and overlay.last is not None:  # short: a narrow chart cuts its subtitle
                subtitle = f"{number(series.last)} · {self.overlay_title} {number(overlay.last)}"
        self.border_subtitle = subtitle
        self.version += 1  # the series object may be the same one, grown: force a repaint

    def render(self) -> Text:
        width = max(1, self.size.width - LABEL_WIDTH)
        height = max(1, self.size.height)
        curves: list[Curve] = [self.series.points()]
        styles = [self.style]
        if self.overlay is not None and self.overlay.count:
            curves.append(self.overlay.points())
            styles.append(self.overlay_style)
        if not curves[0][1]:
            return Text("waiting for data", style="dim")
        grids, low, high, x_low, x_high = braille_plot(curves, width, height)
        tints = _tinted_cells(self.marks, width, x_low, x_high)
        text = Text(no_wrap=True, overflow="crop")
        for index in range(height):
            label = number(high) if index == 0 else number(low) if index == height - 1 else ""
            text.append(f"{label:>{LABEL_WIDTH - 1}} ", style="dim")
            for segment, style in _row_segments([grid[index] for grid in grids], styles, tints):
                text.append(segment, style=style)
            if index < height - 1:
                text.append("\n")
        return text


def _tinted_cells(marks: Sequence[Mark], width: int, x_low: float, x_high: float) -> dict[int, str]:
    """The cell column of each mark within the x range, and its style (the first mark of a cell shows)."""
    tints: dict[int, str] = {}
    for mark in marks:
        if x_low <= mark.x <= x_high:
            column = round((mark.x - x_low) / (x_high - x_low) * (2 * width - 1)) if x_high > x_low else 0
            tints.setdefault(column // 2, mark.style)
    return tints


def _row_segments(rows: list[list[int]], styles: list[str], tints: dict[int, str]) -> list[tuple[str, str]]:
    """One text row of the chart as (characters, style) runs: a cell takes the style of the last series with a
    dot in it (the overlay shows on top), plus its tint."""
    if len(rows) == 1 and not tints:  # one series, nothing marked: the row is one span
        return [("".join(chr(_BRAILLE_BASE + bits) if bits else " " for bits in rows[0]), styles[0])]
    segments: list[tuple[str, str]] = []
    run: list[str] = []
    run_style = ""
    for cell in range(len(rows[0])):
        bits, style = 0, ""
        for row, curve_style in zip(rows, styles, strict=True):
            if row[cell]:
                bits |= row[cell]
                style = curve_style
        if cell in tints:
            style = f"{style} {tints[cell]}".strip()
        if style != run_style and run:
            segments.append(("".join(run), run_style))
            run = []
        run_style = style
        run.append(chr(_BRAILLE_BASE + bits) if bits else " ")
    segments.append(("".join(run), run_style))
    return segments


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
