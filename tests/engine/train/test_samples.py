"""eval.sample_prompts: each evaluation writes greedy continuations to samples.jsonl under FSDP on all ranks,
equal to what transformers' greedy generate gives with the exported checkpoint; `xtrain metrics` prints the
latest; `xtrain eval` gives them too; a cut-off or newer line is handled; bad input is one message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from deeptrace.rundir.layout import samples_path
from transformers import AutoModelForCausalLM
from xtrain.config import load_train_config
from xtrain.data.tokenizer import load_tokenizer_folder
from xtrain.train.sample_record import SampleRecord, SamplesInputError, read_samples
from xtrain.train.sampling import encode_prompt

from tests.engine.checkpoint.cli_runs import DEBUG_CONFIG, xtrain
from tests.engine.train.eval_runs import PROMPTS, SAMPLE_TOKENS, eval_settings
from tests.engine.train.test_cli_errors import assert_user_error

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.xdist_group("eval-run")]


def test_each_evaluation_writes_the_prompts_continuations(evaluated_run: Path) -> None:
    records = read_samples(evaluated_run)
    assert [record.step for record in records] == [2, 4, 6]
    eos = load_tokenizer_folder(load_train_config(evaluated_run / "config.toml").data.tokenizer).token_id("eos_token")
    for record in records:
        assert [sample.prompt for sample in record.samples] == list(PROMPTS)
        for sample in record.samples:
            assert 1 <= len(sample.tokens) <= SAMPLE_TOKENS
            assert sample.ended == (sample.tokens[-1] == eos)
            assert sample.ended or len(sample.tokens) == SAMPLE_TOKENS


def test_the_continuations_are_transformers_greedy_ones(evaluated_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    exported = xtrain("export", evaluated_run, out, cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    folder = load_tokenizer_folder(load_train_config(evaluated_run / "config.toml").data.tokenizer)
    eos = folder.token_id("eos_token")
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, experts_implementation="eager")
    model.train(False)
    ours = {sample.prompt: sample.tokens for sample in read_samples(evaluated_run)[-1].samples}
    for prompt in PROMPTS:
        ids = torch.tensor([encode_prompt(folder, eos, prompt)])
        generated = model.generate(
            ids, max_new_tokens=SAMPLE_TOKENS, do_sample=False, eos_token_id=eos, pad_token_id=eos,
            attention_mask=torch.ones_like(ids),
        )  # fmt: skip
        assert ours[prompt] == generated[0, ids.shape[1] :].tolist(), prompt


def test_xtrain_metrics_prints_the_latest_samples(evaluated_run: Path, tmp_path: Path) -> None:
    result = xtrain("metrics", evaluated_run, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    latest = read_samples(evaluated_run)[-1]
    assert "samples at step 6 (greedy)" in result.stdout
    for sample in latest.samples:
        assert f"{sample.prompt!r} -> {sample.continuation!r}" in result.stdout


def test_xtrain_eval_gives_the_checkpoints_samples(evaluated_run: Path, tmp_path: Path) -> None:
    result = xtrain(
        "eval", DEBUG_CONFIG, "--checkpoint", evaluated_run, *eval_settings(tmp_path / "cache"), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert [sample["tokens"] for sample in figures["samples"]] == [
        sample.tokens for sample in read_samples(evaluated_run)[-1].samples
    ]


def test_a_cut_off_last_line_is_left_out_and_a_newer_version_is_named(tmp_path: Path) -> None:
    record = SampleRecord(step=3, samples=[])
    whole = record.model_dump_json() + "\n"
    samples_path(tmp_path).write_text(whole + whole.replace('"step":3', '"step":4')[:-9])
    assert read_samples(tmp_path) == [record]
    samples_path(tmp_path).write_text(whole.replace('"v":1', '"v":9'))
    with pytest.raises(SamplesInputError, match=r"samples.jsonl:1: sample record version 9 is newer"):
        read_samples(tmp_path)


def test_prompts_without_held_out_data_are_one_message(tmp_path: Path) -> None:
    settings = ("--set", "eval.sources=[]", "--set", 'eval.sample_prompts=["Hi"]')
    result = xtrain("train", DEBUG_CONFIG, "--run-dir", tmp_path / "r", *settings, cwd=tmp_path)
    assert_user_error(result, "eval.sample_prompts: samples are written at each evaluation")
    assert not (tmp_path / "r").exists()
