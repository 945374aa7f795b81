"""`xtrain train` from a Hugging Face folder made by transformers: its first logged loss is the cross-entropy
that transformers itself computes on the same packs (each document run through the HF model on its own)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from xtrain.config import load_train_config
from xtrain.data import PackStream, prepare_corpus

from tests.conftest import REPO_ROOT
from tests.engine.hf_reference import TinyModel, build_reference

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("moe", [True, False], ids=["qwen3-moe", "qwen3-dense"])
def test_training_starts_from_the_hf_weights(tmp_path: Path, moe: bool) -> None:
    hf_dir = tmp_path / "hf"
    # The bundled tokenizer has 515 tokens; the model's vocabulary must hold them all.
    reference = build_reference(TinyModel(moe=moe, vocab_size=520, mlp_only_layers=(0,) if moe else ()), seed=3)
    reference.save_pretrained(hf_dir)
    config = tmp_path / "config.toml"
    config.write_text(
        f'[model]\nhf_path = "{hf_dir}"\n\n'
        f'[data]\nsources = [{{ path = "{REPO_ROOT}/tools/demo_data/sample.jsonl" }}]\n'
        f'tokenizer = "{REPO_ROOT}/examples/tokenizer"\npack_tokens = 96\ncache_dir = "{tmp_path / "cache"}"\n\n'
        '[train]\nmax_steps = 1\nglobal_batch = 2\n\n[parallel]\nmixed_precision = "fp32"\n\n'
        "[trace]\nenabled = false\n"
    )
    result = subprocess.run(
        [str(Path(sys.executable).parent / "xtrain"), "train", str(config), "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    logged = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])

    train_config = load_train_config(config)
    packs = PackStream(prepare_corpus(train_config.data), 96, seed=0).next_packs(2)
    total, targets = 0.0, 0
    with torch.no_grad():
        for pack in packs:
            for start, end in zip(pack.cu_seqlens[:-1], pack.cu_seqlens[1:], strict=True):
                labels = torch.from_numpy(pack.labels[start:end])
                if bool((labels == -100).all()):
                    continue  # padding, or a one-token document: nothing to predict
                ids = torch.from_numpy(pack.input_ids[start:end].astype(np.int64)).unsqueeze(0)
                logits = reference(input_ids=ids).logits[0]
                total += float(F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum"))
                targets += int((labels != -100).sum())
    assert abs(logged["loss"] - total / targets) < 1e-5 * (total / targets)
