"""A checkpoint as a Hugging Face folder: ``xtrain export RUN_DIR|CHECKPOINT OUT``.

One process, no process group: the model is built unsharded on the CPU from the shapes the checkpoint's marker
records, DCP gathers the saved shards into its full tensors (``dcp.load`` without a process group reads every
shard it needs), and the model core's ``save_hf`` writes config.json and safetensors (split into shards with an
index above ``max_shard_bytes``). The tokenizer files of the run's ``data.tokenizer`` folder are copied beside
them. Everything goes into a temporary folder next to OUT, renamed to OUT at the end: OUT is whole or absent.
The host needs memory for the full model once (the master weights, fp32 unless ``dtype`` says otherwise).
"""

from __future__ import annotations

import shutil
import tomllib
import warnings
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from xtrain.config import TrainConfig
from xtrain.errors import CheckpointError
from xtrain.model.config import ModelConfig
from xtrain.model.hf import DEFAULT_MAX_SHARD_BYTES, save_hf
from xtrain.model.transformer import Transformer
from xtrain.parallel.materialize import init_weights_sharded
from xtrain.train.checkpoint.compat import check_fits, saved_shapes
from xtrain.train.checkpoint.locate import ResumePoint

# What a tokenizer folder may hold that transformers' AutoTokenizer reads (never weights or a model config: the
# tokenizer folder is often the Hugging Face model folder the run started from).
TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.json", "vocab.txt",
                   "merges.txt", "chat_template.jinja", "chat_template.json", "*.model")  # fmt: skip


def run_config(point: ResumePoint) -> TrainConfig:
    return TrainConfig.model_validate(tomllib.loads(point.manifest.config_toml))


def load_model(point: ResumePoint) -> Transformer:
    """The checkpoint's model, unsharded, fp32, on the CPU (CheckpointError if the files do not fit it)."""
    model_config = ModelConfig.model_validate(point.manifest.model_config)
    check_fits(point.folder, model_config, saved_shapes(point.folder))
    with torch.device("meta"):
        model = Transformer(model_config)
    model.to_empty(device="cpu")
    init_weights_sharded(model, seed=0)  # fills what the checkpoint does not hold (non-persistent buffers)
    state = {"model": get_model_state_dict(model)}
    with warnings.catch_warnings():
        # DCP warns that there is no process group: reading every shard in one process is the point here.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp_load(state, checkpoint_id=point.folder, no_dist=True)
    set_model_state_dict(model, state["model"])
    return model


def export_hf(
    point: ResumePoint,
    out: Path,
    *,
    dtype: torch.dtype = torch.float32,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    replace: bool = False,
) -> Path:
    """Write the checkpoint's model as a Hugging Face folder at ``out`` (refused if it exists, unless
    ``replace``); returns ``out``."""
    out = out.expanduser().resolve()
    if out.exists() and not replace and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"{out} exists and is not empty: choose another output folder, or remove it")
    config = run_config(point)
    model = load_model(point).to(dtype)
    temporary = out.parent / f".{out.name}.partial"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    save_hf(model, temporary, max_shard_bytes)
    for pattern in TOKENIZER_FILES:
        for file in sorted(config.data.tokenizer.glob(pattern)):
            if file.is_file():
                shutil.copy2(file, temporary / file.name)
    if out.exists():
        shutil.rmtree(out)
    temporary.replace(out)
    return out


def parse_size(text: str) -> int:
    """``5GB``, ``500MB``, ``64KB`` (powers of 1024, as save_hf counts) or a number of bytes."""
    units = {"KB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4, "B": 1}
    cleaned = text.strip().upper().replace("IB", "B")
    for unit, factor in units.items():
        if cleaned.endswith(unit) and cleaned[: -len(unit)].strip().replace(".", "", 1).isdigit():
            return int(float(cleaned[: -len(unit)]) * factor)
    if cleaned.isdigit():
        return int(cleaned)
    raise CheckpointError(f"--max-shard-size {text!r}: expected a size such as 5GB, 500MB or a number of bytes")
