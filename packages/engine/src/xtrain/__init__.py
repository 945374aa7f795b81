"""xtrain: FSDP2 training engine for Mixture-of-Experts language models.

``import xtrain`` stays cheap (no torch): the model API is imported on first use of its names.

- ``xtrain.load_hf(path, dtype=torch.float32)``: a local Hugging Face Qwen3 / Qwen3-MoE folder -> Transformer
- ``xtrain.save_hf(model, path)``: the reverse, loadable by transformers' from_pretrained
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from xtrain.model.hf import load_hf, save_hf

__all__ = ["__version__", "load_hf", "save_hf"]

_LAZY = {"load_hf": "xtrain.model.hf", "save_hf": "xtrain.model.hf"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib  # noqa: PLC0415 (deferred so that `import xtrain` stays free of torch)

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'xtrain' has no attribute {name!r}")
