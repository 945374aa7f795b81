"""A run directory's metrics.jsonl as one typed record per step, and a short label per run for comparisons."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from deeptrace.errors import TraceInputError
from deeptrace.rundir import StepRecord, layout, read_metrics

from xtrain.errors import XtrainError
from xtrain.train.sample_record import SampleRecord, SamplesInputError, read_samples


class MetricsInputError(XtrainError):
    """A run directory whose metrics cannot be read, or an output file that cannot be written: the message names
    the file (and the line)."""


@dataclass(frozen=True)
class RunMetrics:
    """One run: its records in step order, one per step, and where it was resumed."""

    run_dir: Path
    label: str
    records: list[StepRecord]
    resumes: list[tuple[int, int]]
    """(first step logged after the resume, the checkpoint's step resumed from), in the order they happened."""
    samples: SampleRecord | None = None
    """The latest evaluation's greedy continuations (samples.jsonl), None when the run writes none."""

    @property
    def skipped_steps(self) -> list[int]:
        return [record.step for record in self.records if record.skipped]


def load_run(run_dir: Path, label: str | None = None) -> RunMetrics:
    """The run's step records; MetricsInputError for a missing directory or file, a corrupt or empty file."""
    path = layout.metrics_path(run_dir)
    if not run_dir.is_dir():
        raise MetricsInputError(f"{run_dir}: no such run directory")
    if not path.is_file():
        raise MetricsInputError(f"{path}: file not found (is {run_dir} a run directory?)")
    try:
        logged = read_metrics(run_dir)
    except TraceInputError as error:
        raise MetricsInputError(str(error)) from None
    if not logged:
        raise MetricsInputError(f"{path}: no step records yet")
    records, resumes = latest_records(logged)
    return RunMetrics(run_dir, label or run_dir.name, records, resumes, _latest_samples(run_dir, records[-1].step))


def _latest_samples(run_dir: Path, last_step: int) -> SampleRecord | None:
    """The samples of the latest evaluation up to the last logged step (a resumed run that has not reached an
    earlier attempt's evaluation again shows its own latest, not the lost attempt's)."""
    try:
        written = [record for record in read_samples(run_dir) if record.step <= last_step]
    except SamplesInputError as error:
        raise MetricsInputError(str(error)) from None
    return written[-1] if written else None


def latest_records(logged: list[StepRecord]) -> tuple[list[StepRecord], list[tuple[int, int]]]:
    """One record per step, in step order, from the records as appended.

    A record with `resumed_from_step` R starts a new attempt: the steps after R that an earlier attempt logged are
    dropped (the resumed run logs them again). A step logged twice within an attempt is one record, the later
    one's fields over the earlier one's (a loop may log a step's evaluation in a record of its own)."""
    by_step: dict[int, StepRecord] = {}
    resumes: list[tuple[int, int]] = []
    for record in logged:
        if record.resumed_from_step is not None:
            resumes.append((record.step, record.resumed_from_step))
            by_step = {step: kept for step, kept in by_step.items() if step <= record.resumed_from_step}
        earlier = by_step.get(record.step)
        by_step[record.step] = record if earlier is None else _merged(earlier, record)
    return [by_step[step] for step in sorted(by_step)], resumes


def _merged(earlier: StepRecord, later: StepRecord) -> StepRecord:
    update = {name: getattr(later, name) for name in later.model_fields_set}
    update["skipped"] = earlier.skipped or later.skipped
    return earlier.model_copy(update=update)


def run_labels(run_dirs: list[Path]) -> list[str]:
    """Each run directory's name, or as many of its last path parts as tell it from the others."""
    parts = [run_dir.resolve().parts for run_dir in run_dirs]
    for depth in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(run_dir) for run_dir in run_dirs]  # the same directory given twice
