"""The evaluated run the evaluation and sample tests share: examples/debug_moe.toml, 2 processes, 6 steps, an
evaluation (held-out loss and greedy samples) every 2 steps."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.engine.checkpoint.cli_runs import DEBUG_CONFIG, short_run, xtrain

HELDOUT = REPO_ROOT / "tools" / "demo_data" / "heldout.jsonl"
PROMPTS = ("The cat sat on", "Once upon a time")
SAMPLE_TOKENS = 5


def eval_settings(cache: Path) -> list[str]:
    prompts = ", ".join(f'"{prompt}"' for prompt in PROMPTS)
    settings = (
        f'eval.sources=[{{path="{HELDOUT}"}}]', "eval.every_steps=2", "eval.batches=4", "eval.pack_tokens=96",
        f"eval.sample_prompts=[{prompts}]", f"eval.sample_tokens={SAMPLE_TOKENS}",
    )  # fmt: skip
    return short_run(cache, *settings)


def evaluated_run_dir(root: Path) -> Path:
    run_dir = root / "run"
    result = xtrain(
        "train", DEBUG_CONFIG, "--nproc", "2", "--run-dir", run_dir, *eval_settings(root / "cache"), cwd=root
    )
    assert result.returncode == 0, result.stderr
    return run_dir
