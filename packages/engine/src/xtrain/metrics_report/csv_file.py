"""Every step's record as CSV: one row per step (the record that counts), the declared StepRecord fields as
columns in their declared order; with several runs a first column `run` names the run. A field without a value
is an empty cell; numbers are written so that they read back exactly, booleans as true/false."""

from __future__ import annotations

import csv
import io

from deeptrace.rundir import StepRecord

from xtrain.metrics_report.runs import RunMetrics

FIELDS = tuple(StepRecord.model_fields)


def csv_text(runs: list[RunMetrics]) -> str:
    several = len(runs) > 1
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow((["run"] if several else []) + list(FIELDS))
    for run in runs:
        for record in run.records:
            cells = [_cell(getattr(record, name)) for name in FIELDS]
            writer.writerow([run.label, *cells] if several else cells)
    return out.getvalue()


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same float
    return str(value)
