"""``xtrain export`` and ``checkpoint.hf_every_steps``: a Hugging Face folder (config, safetensors shards with an
index, tokenizer files) that transformers loads with the logits of xtrain's model from the same checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
from xtrain.train.checkpoint.export import load_model
from xtrain.train.checkpoint.locate import open_checkpoint

from tests.engine.checkpoint.cli_runs import xtrain
from tests.engine.train.test_cli_errors import assert_user_error

pytestmark = pytest.mark.slow

LOGITS_ATOL = 1e-5  # fp32; the two implementations add in different orders


def _hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    weights: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(shard))
    return weights


def test_export_loads_in_transformers_with_xtrains_logits(finished_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    result = xtrain("export", finished_run, out, "--max-shard-size", "1MB", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (out / "model.safetensors.index.json").is_file() and len(list(out.glob("model-*-of-*.safetensors"))) > 1
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()

    reference = load_model(open_checkpoint(finished_run / "checkpoints" / "step-2", print))
    reference.train(False)
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids_1T = torch.tensor([tokenizer("The checkpoint came back, and the numbers were the same.")["input_ids"]])
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, experts_implementation="eager")
    loaded.train(False)
    with torch.no_grad():
        theirs_1TV = loaded(input_ids=ids_1T).logits
        ours_1TV = reference(ids_1T, torch.tensor([0, ids_1T.shape[1]], dtype=torch.int32))
    assert theirs_1TV.shape == ours_1TV.shape
    assert (theirs_1TV - ours_1TV).abs().max().item() < LOGITS_ATOL

    # The folder the run wrote by itself at step 2 holds the same tensors.
    periodic = finished_run / "hf" / "step-2"
    assert (periodic / "tokenizer.json").is_file() and (finished_run / "logs" / "hf-export-step-2.log").is_file()
    theirs, ours = _hf_weights(periodic), _hf_weights(out)
    assert sorted(theirs) == sorted(ours) and all(torch.equal(theirs[key], ours[key]) for key in ours)


def test_export_refuses_bad_input_and_overwrites_nothing(finished_run: Path, tmp_path: Path) -> None:
    assert_user_error(xtrain("export", tmp_path, tmp_path / "out", cwd=tmp_path), str(tmp_path), "not a checkpoint")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    assert_user_error(xtrain("export", finished_run, taken, cwd=tmp_path), str(taken), "exists and is not empty")
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
