"""What `xtrain metrics` prints: per run the last steps as a table, the best eval loss and its step, the medians
of tokens/s and MFU, where it was resumed and which steps were skipped; a comparison table for several runs."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from xtrain.metrics_report.runs import RunMetrics


@dataclass(frozen=True)
class RunSummary:
    label: str
    steps: int
    """Steps with a record."""
    last_step: int
    last_loss: float | None
    best_eval_loss: float | None
    best_eval_step: int | None
    median_tokens_per_s: float | None
    median_mfu: float | None


def summarise(run: RunMetrics) -> RunSummary:
    evals = [(r.eval_loss, r.step) for r in run.records if r.eval_loss is not None and math.isfinite(r.eval_loss)]
    best: tuple[float | None, int | None] = min(evals, key=lambda pair: pair[0]) if evals else (None, None)
    losses = [r.loss for r in run.records if _finite(r.loss)]
    return RunSummary(
        label=run.label,
        steps=len(run.records),
        last_step=run.records[-1].step,
        last_loss=losses[-1] if losses else None,
        best_eval_loss=best[0],
        best_eval_step=best[1],
        median_tokens_per_s=_median([r.tokens_per_s for r in run.records]),
        median_mfu=_median([r.mfu for r in run.records]),
    )


def format_report(runs: list[RunMetrics], last: int) -> str:
    blocks = [_run_block(run, last, titled=len(runs) > 1) for run in runs]
    if len(runs) > 1:
        blocks.append(_comparison([summarise(run) for run in runs]))
    return "\n\n".join(blocks)


def _run_block(run: RunMetrics, last: int, *, titled: bool) -> str:
    summary = summarise(run)
    has_eval = summary.best_eval_loss is not None
    header = ["step", "loss", *(["eval loss"] if has_eval else []), "grad norm", "lr", "tokens/s", "MFU"]
    rows = []
    for record in run.records[-last:] if last > 0 else []:
        loss = "skipped" if record.skipped and not _finite(record.loss) else _number(record.loss)
        row = [str(record.step), loss, *([_number(record.eval_loss)] if has_eval else [])]
        row += [_number(record.grad_norm), _lr(record.lr), _rate(record.tokens_per_s), _percent(record.mfu)]
        rows.append(row)
    lines = [f"{summary.label} ({run.run_dir})"] if titled else []
    lines += _table(header, rows)
    lines.append(f"steps           {summary.steps} (last {summary.last_step})")
    if has_eval:
        lines.append(f"best eval loss  {_number(summary.best_eval_loss)} at step {summary.best_eval_step}")
    else:
        lines.append("best eval loss  - (no eval_loss in metrics.jsonl)")
    lines.append(f"median tokens/s {_rate(summary.median_tokens_per_s)}")
    lines.append(f"median MFU      {_percent(summary.median_mfu)}")
    for first, checkpoint in run.resumes:
        lines.append(f"resumed         at step {first} from step {checkpoint}")
    if run.skipped_steps:
        lines.append(f"skipped steps   {_step_list(run.skipped_steps)}")
    lines += _samples(run)
    return "\n".join(lines)


def _samples(run: RunMetrics) -> list[str]:
    """The latest evaluation's continuations, one prompt and its continuation per sample."""
    if run.samples is None:
        return []
    lines = [f"samples at step {run.samples.step} (greedy)"]
    for sample in run.samples.samples:
        ending = " <eos>" if sample.ended else " ..."
        lines.append(f"  {sample.prompt!r} -> {sample.continuation!r}{ending}")
    return lines


def _comparison(summaries: list[RunSummary]) -> str:
    header = ["run", "last step", "loss", "best eval loss", "at step", "median tokens/s", "median MFU"]
    rows = [
        [s.label, str(s.last_step), _number(s.last_loss), _number(s.best_eval_loss),
         "-" if s.best_eval_step is None else str(s.best_eval_step), _rate(s.median_tokens_per_s),
         _percent(s.median_mfu)]
        for s in summaries
    ]  # fmt: skip
    return "\n".join(_table(header, rows, left_columns=1))


def _table(header: list[str], rows: list[list[str]], left_columns: int = 0) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            cell.ljust(width) if index < left_columns else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(header), *(line(row) for row in rows)]


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _median(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None and math.isfinite(value)]
    return statistics.median(known) if known else None


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _lr(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _step_list(steps: list[int], most: int = 12) -> str:
    shown = ", ".join(map(str, steps[:most]))
    return shown + (f" and {len(steps) - most} more" if len(steps) > most else "") + f" ({len(steps)})"
