"""`xtrain metrics RUN_DIR [RUN_DIR ...] [--plot FILE.png] [--csv FILE]` over run directories written through
deeptrace's RunWriter: the table's values, the best eval step, the medians, resumes and skipped steps, the CSV
read back, the PNG drawn (one run and two overlaid), and every bad input as one message with exit code 2."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result
from deeptrace.rundir import RunWriter, StepRecord, layout
from matplotlib.image import imread
from xtrain.cli import main
from xtrain.metrics_report.csv_file import FIELDS
from xtrain.metrics_report.runs import latest_records, load_run, run_labels
from xtrain.metrics_report.summary import summarise

EVAL_EVERY = 10


def record(step: int, scale: float = 1.0, **fields: object) -> StepRecord:
    evaluated = step % EVAL_EVERY == 0
    values: dict[str, object] = {
        "step": step, "loss": scale * (2.0 + 6.0 / step), "grad_norm": 1.0 / step, "lr": 1e-3 * min(1.0, step / 5),
        "tokens_per_s": 1000.0 + 10 * step, "mfu": 0.2 + 0.001 * step, "max_steps": 40, "time_unix_s": 1e9 + step,
        "eval_loss": scale * (2.5 + 5.0 / step) if evaluated else None,
        "eval_ppl": math.exp(scale * (2.5 + 5.0 / step)) if evaluated else None,
    }  # fmt: skip
    values.update(fields)
    return StepRecord.model_validate(values)


def write_run(run_dir: Path, records: list[StepRecord]) -> Path:
    with RunWriter(run_dir, rank=0, world_size=1) as writer:
        for one in records:
            writer.append_step(one)
    return run_dir


def plain_run(run_dir: Path, steps: int = 40, scale: float = 1.0) -> Path:
    return write_run(run_dir, [record(step, scale) for step in range(1, steps + 1)])


def xtrain_metrics(*args: str | Path) -> Result:
    return CliRunner().invoke(main, ["metrics", *map(str, args)])


def test_the_table_shows_the_last_steps_the_best_eval_and_the_medians(tmp_path: Path) -> None:
    run_dir = plain_run(tmp_path / "run")
    result = xtrain_metrics(run_dir, "--last", "3")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["step", "loss", "eval", "loss", "grad", "norm", "lr", "tokens/s", "MFU"]
    assert [line.split() for line in lines[1:4]] == [
        ["38", f"{2 + 6 / 38:.4f}", "-", f"{1 / 38:.4f}", "1.00e-03", "1,380", "23.8%"],
        ["39", f"{2 + 6 / 39:.4f}", "-", f"{1 / 39:.4f}", "1.00e-03", "1,390", "23.9%"],
        ["40", f"{2 + 6 / 40:.4f}", f"{2.5 + 5 / 40:.4f}", f"{1 / 40:.4f}", "1.00e-03", "1,400", "24.0%"],
    ]
    # The medians of steps 1..40: tokens/s 1000 + 10·20.5, MFU 0.2 + 0.001·20.5.
    assert "best eval loss  2.6250 at step 40" in lines
    assert "median tokens/s 1,205" in lines
    assert "median MFU      22.1%" in lines
    summary = summarise(load_run(run_dir))
    assert summary.median_tokens_per_s == pytest.approx(1205.0)
    assert summary.median_mfu == pytest.approx(0.2205)
    assert (summary.best_eval_step, summary.best_eval_loss) == (40, pytest.approx(2.625))


def test_the_best_eval_is_the_lowest_not_the_last_and_a_run_without_eval_says_so(tmp_path: Path) -> None:
    records = [record(step) for step in range(1, 31)]
    records[19] = record(20, eval_loss=1.5)  # step 20 evaluates best; 30 is worse again
    summary = summarise(load_run(write_run(tmp_path / "run", records)))
    assert (summary.best_eval_step, summary.best_eval_loss) == (20, 1.5)
    result = xtrain_metrics(write_run(tmp_path / "no-eval", [record(s, eval_loss=None) for s in range(1, 5)]))
    assert result.exit_code == 0
    assert "eval loss" not in result.output.splitlines()[0]
    assert "best eval loss  - (no eval_loss in metrics.jsonl)" in result.output


def test_a_resumed_run_counts_the_later_records_and_a_skipped_step_is_named(tmp_path: Path) -> None:
    first = [record(step) for step in range(1, 26)]  # the attempt that died after step 25
    skipped = record(12, loss=None, grad_norm=None, skipped=True)
    first[11] = skipped
    second = [record(21, scale=2.0, resumed_from_step=20), *(record(step, scale=2.0) for step in range(22, 31))]
    run = load_run(write_run(tmp_path / "run", first + second))
    assert [r.step for r in run.records] == list(range(1, 31))
    assert [r.loss for r in run.records[20:]] == [2.0 * (2 + 6 / step) for step in range(21, 31)]
    assert run.records[19].loss == 2 + 6 / 20  # before the resume point: the first attempt's
    assert run.resumes == [(21, 20)]
    assert run.skipped_steps == [12]
    output = xtrain_metrics(tmp_path / "run").output
    assert "resumed         at step 21 from step 20" in output
    assert "skipped steps   12 (1)" in output
    # Step 20's evaluation (2.5 + 5/20) is the first attempt's, kept: the run resumed from step 20's checkpoint.
    assert summarise(run).best_eval_step == 20


def test_a_step_logged_twice_in_one_attempt_keeps_both_records_fields_the_later_first() -> None:
    train = record(10, eval_loss=None, eval_ppl=None)
    evaluation = StepRecord.model_validate({"step": 10, "eval_loss": 2.0, "eval_ppl": math.exp(2.0)})
    (merged,), _ = latest_records([train, evaluation])
    assert (merged.loss, merged.grad_norm, merged.eval_loss) == (train.loss, train.grad_norm, 2.0)
    again = record(10, loss=1.0)
    (latest,), _ = latest_records([train, again])
    assert latest.loss == 1.0


def test_the_csv_holds_every_step_and_reads_back_as_the_same_records(tmp_path: Path) -> None:
    records = [record(step) for step in range(1, 21)]
    records[4] = record(5, loss=None, skipped=True, resumed_from="ckpt/step-4", resumed_from_step=4)
    run_dir = write_run(tmp_path / "run", records)
    out = tmp_path / "steps.csv"
    assert xtrain_metrics(run_dir, "--csv", out).exit_code == 0
    with out.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == list(FIELDS) == list(StepRecord.model_fields)
    strings = {"resumed_from"}
    read_back = [
        StepRecord.model_validate(
            {name: cell if name in strings else json.loads(cell) for name, cell in row.items() if cell != ""}
        )
        for row in rows
    ]
    assert read_back == load_run(run_dir).records
    assert read_back[4].skipped and read_back[4].resumed_from == "ckpt/step-4" and read_back[4].loss is None


def test_two_runs_are_compared_and_their_csv_names_the_run(tmp_path: Path) -> None:
    a, b = plain_run(tmp_path / "lr-1e-3"), plain_run(tmp_path / "lr-3e-4", steps=30, scale=1.5)
    out = tmp_path / "both.csv"
    result = xtrain_metrics(a, b, "--csv", out)
    assert result.exit_code == 0, result.output
    comparison = result.output.split("\n\n")[-1].splitlines()
    assert comparison[0].split()[:3] == ["run", "last", "step"]
    assert comparison[1].split()[:4] == ["lr-1e-3", "40", f"{2 + 6 / 40:.4f}", "2.6250"]
    assert comparison[2].split()[:4] == ["lr-3e-4", "30", f"{1.5 * (2 + 6 / 30):.4f}", f"{1.5 * (2.5 + 5 / 30):.4f}"]
    assert result.output.startswith(f"lr-1e-3 ({a})\n")
    with out.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["run"] for row in rows] == ["lr-1e-3"] * 40 + ["lr-3e-4"] * 30


def test_runs_of_the_same_name_are_told_apart_by_their_parent() -> None:
    assert run_labels([Path("/x/a/run"), Path("/x/b/run"), Path("/x/c")]) == ["a/run", "b/run", "x/c"]
    assert run_labels([Path("/x/one"), Path("/x/two")]) == ["one", "two"]


def _picture(path: Path) -> np.ndarray:
    assert path.stat().st_size > 20_000
    return imread(path)


def _colours(image: np.ndarray) -> set[tuple[int, ...]]:
    return {tuple(pixel) for pixel in (image[..., :3] * 255).astype(int).reshape(-1, 3)[::7]}


def test_the_plot_is_a_png_of_the_four_curves(tmp_path: Path) -> None:
    run_dir = plain_run(tmp_path / "run")
    out = tmp_path / "curves.png"
    result = xtrain_metrics(run_dir, "--plot", out)
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = _picture(out)
    assert image.shape[:2] == (750, 1200)
    assert len(_colours(image)) > 50  # lines, text, grid and antialiasing: far from a blank picture


def test_two_runs_overlay_in_their_own_colours(tmp_path: Path) -> None:
    a, b = plain_run(tmp_path / "a"), plain_run(tmp_path / "b", scale=1.3)
    one, two = tmp_path / "one.png", tmp_path / "two.png"
    assert xtrain_metrics(a, "--plot", one).exit_code == 0
    assert xtrain_metrics(a, b, "--plot", two).exit_code == 0
    # matplotlib's first two colours: run a in blue (#1f77b4), run b in orange (#ff7f0e).
    blue, orange = (31, 119, 180), (255, 127, 14)
    for path, expected in ((one, {blue}), (two, {blue, orange})):
        pixels = (_picture(path)[..., :3] * 255).round().astype(int).reshape(-1, 3)
        found = {colour for colour in (blue, orange) if (np.abs(pixels - colour).sum(axis=1) <= 6).sum() > 200}
        assert found == expected, path


def test_bad_input_is_one_message_naming_the_file_and_exit_2(tmp_path: Path) -> None:
    good = plain_run(tmp_path / "good")
    (tmp_path / "empty").mkdir()
    corrupt = plain_run(tmp_path / "corrupt", steps=3)
    with layout.metrics_path(corrupt).open("ab") as handle:
        handle.write(b"{not json\n")
        handle.write(record(5).to_line())
    cases = [
        ([tmp_path / "absent"], f"{tmp_path / 'absent'}: no such run directory"),
        ([good, tmp_path / "empty"], f"{layout.metrics_path(tmp_path / 'empty')}: file not found"),
        ([corrupt], f"{layout.metrics_path(corrupt)}:4: invalid JSON line"),
        ([good, "--plot", tmp_path / "no" / "such" / "folder.png"], f"{tmp_path / 'no' / 'such' / 'folder.png'}: "),
        ([good, "--csv", tmp_path], f"{tmp_path}: cannot write"),
    ]
    for args, needle in cases:
        result = CliRunner().invoke(main, ["metrics", *map(str, args)])
        assert result.exit_code == 2, (args, result.output)
        errors = [line for line in result.output.splitlines() if line.startswith("xtrain: error:")]
        assert len(errors) == 1 and needle in errors[0], (args, result.output)
        assert "Traceback" not in result.output
    layout.metrics_path(tmp_path / "empty").write_bytes(b"")
    result = xtrain_metrics(tmp_path / "empty")
    assert result.exit_code == 2 and "no step records yet" in result.output
