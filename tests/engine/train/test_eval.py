"""Evaluation during training ([eval]): the held-out loss under FSDP equals the loss transformers computes on the
same packs with the exported checkpoint; `xtrain eval` gives the run's figure from its checkpoint on another
world size; a resumed run keeps the evaluation schedule and its values; bad input is one message."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM
from xtrain.config import load_train_config
from xtrain.parallel.distributed import Distributed
from xtrain.train.evaluate import eval_packs

from tests.engine.checkpoint.cli_runs import DEBUG_CONFIG, environment, xtrain
from tests.engine.train.eval_runs import eval_settings as _eval_settings
from tests.engine.train.test_cli_errors import assert_user_error

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.xdist_group("eval-run")]

ATOL = 1e-4


def _records(run_dir: Path) -> dict[int, dict[str, object]]:
    """The later record of each step (a resumed run appends)."""
    found: dict[int, dict[str, object]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        found[record["step"]] = record
    return found


def test_eval_runs_on_its_schedule_and_after_the_last_step(evaluated_run: Path) -> None:
    records = _records(evaluated_run)
    evaluated = sorted(step for step, record in records.items() if "eval_loss" in record)
    assert evaluated == [2, 4, 6]
    for step in evaluated:
        record = records[step]
        assert isinstance(record["eval_loss"], float) and record["eval_ppl"] == pytest.approx(
            np.exp(record["eval_loss"]), rel=1e-12
        )
    assert records[2]["eval_loss"] != records[6]["eval_loss"]  # the weights moved; the packs did not


def test_eval_loss_equals_transformers_on_the_same_packs(evaluated_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    exported = xtrain("export", evaluated_run, out, cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    config = load_train_config(evaluated_run / "config.toml")
    alone = Distributed(0, 1, 0, 1, torch.device("cpu"), "gloo")
    packs = eval_packs(config, alone, lambda: None, lambda message: None)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, experts_implementation="eager")
    model.train(False)
    total, targets = 0.0, 0
    with torch.no_grad():
        for pack in packs:
            bounds = pack.cu_seqlens.tolist()
            for start, end in itertools.pairwise(bounds):
                labels = torch.from_numpy(pack.labels[start:end])
                if (labels != -100).sum() == 0:
                    continue
                logits = model(input_ids=torch.from_numpy(pack.input_ids[start:end]).unsqueeze(0)).logits[0]
                total += torch.nn.functional.cross_entropy(logits.double(), labels, reduction="sum").item()
                targets += int((labels != -100).sum())
    theirs = total / targets
    ours = _records(evaluated_run)[6]["eval_loss"]
    assert isinstance(ours, float)
    assert abs(ours - theirs) < ATOL, (ours, theirs)


def test_xtrain_eval_gives_the_runs_figure_on_another_world_size(evaluated_run: Path, tmp_path: Path) -> None:
    result = xtrain(
        "eval", DEBUG_CONFIG, "--checkpoint", evaluated_run, *_eval_settings(tmp_path / "cache"), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["step"] == 6 and figures["eval_packs"] == 4
    assert figures["eval_loss"] == pytest.approx(_records(evaluated_run)[6]["eval_loss"], abs=1e-6)


def test_a_resumed_run_keeps_the_schedule_and_the_values(evaluated_run: Path, tmp_path: Path) -> None:
    """A crash after step 5 (checkpoints of steps 4 and 6 lost): the resume from step 2 evaluates at 4 and 6
    again, with the uninterrupted run's values."""
    crashed = tmp_path / "crashed"
    shutil.copytree(evaluated_run, crashed)
    for step in (4, 6):
        shutil.rmtree(crashed / "checkpoints" / f"step-{step}")
        shutil.rmtree(crashed / "hf" / f"step-{step}", ignore_errors=True)
    lines = (crashed / "metrics.jsonl").read_text().splitlines()
    (crashed / "metrics.jsonl").write_text("\n".join(line for line in lines if json.loads(line)["step"] <= 5) + "\n")
    result = xtrain(
        "train", DEBUG_CONFIG, "--nproc", "2", "--run-dir", crashed, *_eval_settings(tmp_path / "cache"), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    resumed, reference = _records(crashed), _records(evaluated_run)
    assert resumed[3]["resumed_from_step"] == 2
    assert sorted(step for step, record in resumed.items() if "eval_loss" in record) == [2, 4, 6]
    for step in (4, 6):
        assert resumed[step]["eval_loss"] == pytest.approx(reference[step]["eval_loss"], abs=1e-6)


def test_eval_bad_input_is_one_message(evaluated_run: Path, tmp_path: Path) -> None:
    no_eval = xtrain(
        "eval",
        DEBUG_CONFIG,
        "--checkpoint",
        evaluated_run,
        "--set",
        "eval.sources=[]",
        "--set",
        "eval.sample_prompts=[]",
        cwd=tmp_path,
    )
    assert_user_error(no_eval, "eval.sources is empty")
    missing = xtrain("eval", DEBUG_CONFIG, "--checkpoint", tmp_path / "nothing", cwd=tmp_path)
    assert_user_error(missing, "does not exist")
    uneven = xtrain(
        "train", DEBUG_CONFIG, "--nproc", "2", "--run-dir", tmp_path / "r", "--set", "eval.batches=3", cwd=tmp_path,
        env=environment(),
    )  # fmt: skip
    assert_user_error(uneven, "eval.batches = 3 must be a multiple of the number of processes (2)")
