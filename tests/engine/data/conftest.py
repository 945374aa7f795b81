"""Fixtures of the data pipeline tests: a private token cache, and transformers' tokenizer as the reference."""

from pathlib import Path
from typing import Any

import pytest

from .corpora import EXAMPLE_TOKENIZER, load_hf_tokenizer


@pytest.fixture(autouse=True)
def private_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's default token cache is its own tmp folder: nothing here may touch ~/.cache/xtrain."""
    cache = tmp_path / "default-cache"
    monkeypatch.setenv("XTRAIN_CACHE_DIR", str(cache))
    return cache


@pytest.fixture(scope="session")
def hf_tokenizer() -> Any:
    """transformers' own tokenizer of the example folder (local files only): the independent reference."""
    return load_hf_tokenizer(EXAMPLE_TOKENIZER)
