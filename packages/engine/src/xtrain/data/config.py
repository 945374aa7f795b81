"""The ``[data]`` section of a training config: where the JSONL lives, how to tokenise it, how long a pack is.

Paths arrive absolute: the trainer resolves them relative to the config file before validation.
"""

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CACHE_DIR_ENV = "XTRAIN_CACHE_DIR"
"""Environment variable that moves the default token cache (used when ``data.cache_dir`` is not set)."""
DEFAULT_CACHE_DIR = Path("~/.cache/xtrain/tokens")
"""Where tokenised documents are cached when neither ``data.cache_dir`` nor ``XTRAIN_CACHE_DIR`` is set."""


class DataSource(BaseModel):
    """One JSONL file, or a folder of them, and its share of the mixture."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path
    """A ``.jsonl`` file, or a folder whose ``*.jsonl`` files (recursively, in sorted order) form the source."""
    weight: float = Field(default=1.0, gt=0)
    """Relative share of this source in the training tokens: sources are interleaved so that the tokens drawn from
    each stay proportional to their weights (each source cycles through its own epochs independently)."""


class DataConfig(BaseModel):
    """Training data: sources, format, tokenizer and pack length (TOML section ``[data]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sources: list[DataSource] = Field(min_length=1)
    """The JSONL sources mixed by weight (at least one)."""
    kind: Literal["pretrain", "chat"] = "pretrain"
    """``pretrain``: lines ``{"text": ...}``, loss on every token. ``chat``: lines ``{"messages": [{"role",
    "content"}, ...]}`` rendered with the tokenizer folder's chat template, loss on assistant tokens only."""
    tokenizer: Path
    """A local Hugging Face tokenizer folder holding ``tokenizer.json`` and ``tokenizer_config.json``."""
    pack_tokens: int = Field(gt=0)
    """Length of every pack (tokens per row fed to the model); documents are packed into rows of exactly this."""
    pack_lookahead: int = Field(default=64, ge=1)
    """How many upcoming document pieces the packer may search to fill the end of a pack before padding it."""
    balance_window: int = Field(default=0, ge=0)
    """Data-parallel balance: within every window of this many optimizer steps, packs are formed and given to
    ranks and micro-steps so that the ranks' attention work is as equal as possible at each micro-step; every
    document is still used once per epoch (0: off; see docs/engine-data.md)."""
    cache_dir: Path | None = None
    """Token cache folder; None uses ``$XTRAIN_CACHE_DIR``, else ``~/.cache/xtrain/tokens``."""

    def resolved_cache_dir(self) -> Path:
        """The token cache folder this config uses (see ``cache_dir``)."""
        if self.cache_dir is not None:
            return self.cache_dir
        from_env = os.environ.get(CACHE_DIR_ENV)
        return Path(from_env).expanduser() if from_env else DEFAULT_CACHE_DIR.expanduser()
