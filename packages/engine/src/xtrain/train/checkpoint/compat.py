"""Whether a checkpoint fits the model about to be trained or exported, decided before anything is written.

The DCP metadata file lists every saved tensor with its global shape; the model, built on the meta device (no
memory), lists what it expects. The first difference, in the model's own order, is the message: a missing key, a
shape that differs, or a key the checkpoint has and the model has not.
"""

from __future__ import annotations

from pathlib import Path

from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from xtrain.errors import CheckpointError
from xtrain.model.config import ModelConfig
from xtrain.model.transformer import Transformer

MODEL_PREFIX = "model."


def saved_shapes(folder: Path) -> dict[str, tuple[int, ...] | None]:
    """Every key of the checkpoint's DCP metadata: the global shape of a tensor, None for another object."""
    try:
        metadata = FileSystemReader(folder).read_metadata()
    except Exception as error:
        raise CheckpointError(f"{folder}: cannot read DCP's .metadata ({type(error).__name__}: {error})") from None
    return {
        key: tuple(entry.size) if isinstance(entry, TensorStorageMetadata) else None
        for key, entry in metadata.state_dict_metadata.items()
    }


def expected_model_shapes(model_config: ModelConfig) -> dict[str, tuple[int, ...]]:
    import torch  # noqa: PLC0415 (only the meta device)

    with torch.device("meta"):
        model = Transformer(model_config)
    return {MODEL_PREFIX + name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def check_fits(folder: Path, model_config: ModelConfig, saved: dict[str, tuple[int, ...] | None]) -> None:
    """CheckpointError naming ``folder`` and the first mismatch when the checkpoint is of another model."""
    expected = expected_model_shapes(model_config)
    problems = []
    for key, shape in expected.items():
        name = key.removeprefix(MODEL_PREFIX)
        if key not in saved:
            problems.append(f"'{name}' is not in the checkpoint")
        elif saved[key] != shape:
            saved_shape = list(saved[key] or ())
            problems.append(f"'{name}' has shape {saved_shape} in the checkpoint, {list(shape)} in this model")
    for key in saved:
        if key.startswith(MODEL_PREFIX) and key not in expected:
            problems.append(f"the checkpoint holds '{key.removeprefix(MODEL_PREFIX)}', which this model has not")
    if problems:
        more = f" (and {len(problems) - 1} more differences)" if len(problems) > 1 else ""
        raise CheckpointError(f"checkpoint {folder} is of another model: {problems[0]}{more}")
