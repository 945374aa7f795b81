"""The PNG of `xtrain metrics --plot`: loss, eval loss, grad norm and tokens/s against the step, a 2×2 grid.

Several runs overlay in each panel, one colour per run throughout, labelled by the run's name. A noisy loss is
drawn faint with its moving average over it; resumes are dotted vertical lines, skipped steps crosses on the
loss panel; a grad norm with a spike gets a log scale. matplotlib is imported here only (Agg, no display)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from xtrain.metrics_report.runs import RunMetrics

if TYPE_CHECKING:
    from matplotlib.axes import Axes

LOG_SCALE_FROM = 20  # a grad norm whose largest value is this many times its smallest gets a log scale
SMOOTH_FROM = 40  # points from which the loss gets a moving average over it
PANELS = (
    ("loss", "training loss"),
    ("eval_loss", "eval loss"),
    ("grad_norm", "grad norm (before clipping)"),
    ("tokens_per_s", "tokens/s"),
)


def write_plot(runs: list[RunMetrics], path: Path) -> None:
    """Raises OSError when the file cannot be written."""
    import matplotlib  # noqa: PLC0415 (lazy: `xtrain --help` and the table do without it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    first, last = min(r.records[0].step for r in runs), max(r.records[-1].step for r in runs)
    pad = max(0.5, 0.02 * (last - first))
    x_range = (first - pad, last + pad)
    fig, grid = plt.subplots(2, 2, figsize=(12, 7.5), layout="constrained")
    try:
        for axes, (field, title) in zip(grid.flat, PANELS, strict=True):
            drawn = 0
            for index, run in enumerate(runs):
                drawn += _draw(axes, run, field, colours[index % len(colours)])
            axes.set_title(title)
            axes.set_xlabel("step")
            axes.set_ylabel(title.split(" (")[0])
            axes.grid(visible=True, alpha=0.3)
            axes.set_xlim(*x_range)  # every panel on the same steps, so they read against each other
            if field == "grad_norm" and _spread(runs, field) > LOG_SCALE_FROM:
                axes.set_yscale("log")  # a spike would flatten the rest of the curve
            if drawn:
                axes.legend(loc="best", fontsize="small")
            else:
                axes.text(0.5, 0.5, f"no {field} in metrics.jsonl", ha="center", va="center",
                          transform=axes.transAxes, color="grey")  # fmt: skip
        fig.suptitle("Run " + runs[0].label if len(runs) == 1 else "Runs " + ", ".join(r.label for r in runs))
        fig.savefig(path, dpi=100, format="png")
    finally:
        plt.close(fig)


def _draw(axes: Axes, run: RunMetrics, field: str, colour: str) -> int:
    points = [(r.step, float(value)) for r in run.records if (value := getattr(r, field)) is not None]
    points = [(step, value) for step, value in points if math.isfinite(value)]
    if not points:
        return 0
    steps, values = [p[0] for p in points], [p[1] for p in points]
    if field == "eval_loss":
        axes.plot(steps, values, color=colour, marker="o", markersize=3, label=run.label)
    elif field == "loss" and len(values) >= SMOOTH_FROM:
        axes.plot(steps, values, color=colour, alpha=0.3, linewidth=0.8)
        axes.plot(steps, _moving_average(values, max(5, len(values) // 20)), color=colour,
                  label=f"{run.label} (moving average)")  # fmt: skip
    else:
        axes.plot(steps, values, color=colour, linewidth=1.2, label=run.label)
    if field == "loss" and run.skipped_steps:
        low = min(values)
        axes.plot(run.skipped_steps, [low] * len(run.skipped_steps), "x", color=colour,
                  label=f"{run.label}: skipped steps")  # fmt: skip
    for index, (first, _) in enumerate(run.resumes):
        where = ", ".join(str(step) for step, _ in run.resumes[:4]) + (", …" if len(run.resumes) > 4 else "")
        label = f"{run.label}: resumed at {where}" if field == "loss" and index == 0 else None
        axes.axvline(first, color=colour, linestyle=":", linewidth=1, label=label)
    return 1


def _spread(runs: list[RunMetrics], field: str) -> float:
    """The largest positive value of the field over its smallest (1 without two)."""
    values = [v for run in runs for r in run.records if (v := getattr(r, field)) is not None and 0 < v < math.inf]
    return max(values) / min(values) if len(values) > 1 else 1.0


def _moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over `window` points (fewer at the start)."""
    out, total = [], 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        out.append(total / min(index + 1, window))
    return out
