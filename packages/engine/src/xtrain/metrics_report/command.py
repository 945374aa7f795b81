"""`xtrain metrics`: read the runs, write the CSV and the PNG asked for, return the text to print."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from xtrain.metrics_report.csv_file import csv_text
from xtrain.metrics_report.plot import write_plot
from xtrain.metrics_report.runs import MetricsInputError, load_run, run_labels
from xtrain.metrics_report.summary import format_report

DEFAULT_LAST = 10


def run_metrics(run_dirs: list[Path], plot: Path | None, csv: Path | None, last: int = DEFAULT_LAST) -> str:
    """The report's text; MetricsInputError (naming the file) for a bad run directory or an unwritable output."""
    labels = run_labels(run_dirs)
    runs = [load_run(run_dir, label) for run_dir, label in zip(run_dirs, labels, strict=True)]
    if csv is not None:
        _write(csv, lambda: csv.write_text(csv_text(runs)))
    if plot is not None:
        _write(plot, lambda: write_plot(runs, plot))
    return format_report(runs, last)


def _write(path: Path, write: Callable[[], object]) -> None:
    try:
        write()
    except OSError as error:
        raise MetricsInputError(f"{path}: cannot write ({error.strerror or error})") from None
