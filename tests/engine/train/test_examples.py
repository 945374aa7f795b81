"""Every config in examples/ is valid as written (a user copies them): each parses and validates."""

from pathlib import Path

import pytest
from xtrain.config import load_train_config, missing_paths

from tests.conftest import REPO_ROOT

EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.toml"))


def test_the_named_examples_exist() -> None:
    names = {path.name for path in EXAMPLES}
    assert {
        "debug_moe.toml",
        "qwen3_30b_a3b.toml",
        "qwen3_235b_a22b.toml",
        "gpt_oss_120b.toml",
        "deepseek_v3_671b.toml",
        "kimi_k2_1t.toml",
    } <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_an_example_config_validates(path: Path) -> None:
    config = load_train_config(path)
    assert config.train.max_steps > 0
    if path.name == "debug_moe.toml":
        assert missing_paths(config) == []  # the demo's config names files that ship with the repo
