"""``xtrain data prepare CONFIG.toml`` through the real command line: it builds the cache and prints a summary
(exit 0), and a source without a valid line is exit code 2 with one message naming the file, no traceback."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .corpora import EXAMPLE_TOKENIZER, pretrain_records, write_jsonl

XTRAIN = Path(sys.executable).parent / "xtrain"


def write_config(folder: Path, source: Path) -> Path:
    config = folder / "run.toml"
    config.write_text(
        f"""
[model]
size = "debug"

[data]
sources = [{{ path = {json.dumps(str(source))}, weight = 1.0 }}]
kind = "pretrain"
tokenizer = {json.dumps(str(EXAMPLE_TOKENIZER))}
pack_tokens = 64

[train]
max_steps = 1
global_batch = 1
"""
    )
    return config


def prepare(config: Path, cache_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "XTRAIN_CACHE_DIR": str(cache_dir / "not-this-one")}
    command = [str(XTRAIN), "data", "prepare", str(config), "--set", f"data.cache_dir={json.dumps(str(cache_dir))}"]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)


@pytest.mark.slow
def test_prepare_builds_the_cache_and_prints_a_summary(tmp_path: Path) -> None:
    records: list[object] = [*pretrain_records(30), "{broken"]
    source = write_jsonl(tmp_path / "docs.jsonl", records)
    cache_dir = tmp_path / "cache"
    result = prepare(write_config(tmp_path, source), cache_dir)

    assert result.returncode == 0, result.stderr
    summary = result.stdout.strip().splitlines()
    assert len(summary) == 1  # the summary alone on stdout; progress and log lines go to stderr
    assert "30 documents" in summary[0] and "1 skipped lines" in summary[0] and str(cache_dir) in summary[0]
    assert f"{source}:31:" in result.stderr
    assert "documents" not in result.stderr  # printed once, not also logged
    assert list(cache_dir.glob("docs-*/part-00000/meta.json"))
    assert not (cache_dir / "not-this-one").exists()


@pytest.mark.slow
def test_prepare_with_an_unusable_source_exits_2_with_one_message(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "broken.jsonl", ['{"txt": "no text"}', "not json"])
    result = prepare(write_config(tmp_path, source), tmp_path / "cache")

    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    # Besides the progress bar (drawn for a terminal), stderr holds the one message: the file, then why.
    messages = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("tokenising")]
    assert len(messages) == 1 and messages[0].startswith(f"xtrain: error: {source}: ")
    assert result.stdout == ""
