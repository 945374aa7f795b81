"""The braille line chart: a second series on the same axes, placed by step, and steps marked by a tint."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from xtop.chart import LineChart, Mark, braille_plot, dot_columns
from xtop.series import DecimatedSeries

pytestmark = pytest.mark.anyio


def lit(grid: list[list[int]]) -> set[tuple[int, int]]:
    return {(row, cell) for row, bits in enumerate(grid) for cell, value in enumerate(bits) if value}


def test_a_sparse_series_lines_up_with_a_dense_one_by_step() -> None:
    dense = ([float(x) for x in range(100)], [float(x) for x in range(100)])
    sparse = ([0.0, 33.0, 66.0, 99.0], [0.0, 33.0, 66.0, 99.0])  # the same line, every 33 steps
    (dense_grid, sparse_grid), low, high, x_low, x_high = braille_plot([dense, sparse], 20, 5)
    assert (low, high, x_low, x_high) == (0.0, 99.0, 0.0, 99.0)
    assert lit(sparse_grid) == lit(dense_grid)
    # Placed by index instead, a series of the second half only would span the whole width; by step it stays right.
    late = ([50.0, 99.0], [50.0, 99.0])
    (_, late_grid), *_ = braille_plot([dense, late], 20, 5)
    assert min(cell for _, cell in lit(late_grid)) == 10


def test_both_series_share_the_value_range() -> None:
    (first, second), low, high, *_ = braille_plot([([1.0, 2.0], [1.0, 2.0]), ([1.0, 2.0], [3.0, 4.0])], 4, 2)
    assert (low, high) == (1.0, 4.0)
    assert max(row for row, _ in lit(second)) <= min(row for row, _ in lit(first))  # drawn above the first


def test_points_in_one_dot_column_are_averaged() -> None:
    assert dot_columns([0.0, 0.1, 10.0], [1.0, 3.0, 5.0], 3, 0.0, 10.0) == [2.0, None, 5.0]


class _Chart(App[None]):
    def compose(self) -> ComposeResult:
        yield LineChart("loss", id="chart", style="green", overlay_title="eval", overlay_style="yellow")


async def test_the_chart_draws_the_overlay_in_its_colour_and_tints_marked_steps() -> None:
    loss, evaluation = DecimatedSeries(), DecimatedSeries()
    for step in range(1, 101):
        loss.append(step, 10.0 / step)
        if step % 25 == 0:
            evaluation.append(step, 12.0 / step)
    app = _Chart()
    async with app.run_test(size=(47, 10)) as pilot:
        chart = app.query_one(LineChart)
        chart.show(loss, evaluation, [Mark(51, "on dark_blue"), Mark(500, "on dark_red")])
        await pilot.pause()
        assert chart.border_subtitle == "0.1 · eval 0.12"
        assert "eval" in str(chart.border_title)
        text = chart.render()
        styles = {str(span.style) for span in text.spans}
        assert {"green", "yellow"} <= styles
        assert any("on dark_blue" in style for style in styles)  # step 51: inside the chart
        assert not any("dark_red" in style for style in styles)  # step 500: beyond the run, not drawn
        chart.show(loss)
        assert chart.border_subtitle == "last 0.1" and "eval" not in str(chart.border_title)
