"""Materialise a model built on the meta device (and usually sharded already): allocate, then initialise or load.

Initialisation goes part by part (the model's ``init_part_names``): an unsharded twin of one part is allocated,
initialised with that part's seeded generator, and each rank copies its shard out of it; then the twin is freed.
So a sharded model gets exactly the weights the unsharded model gets from ``init_weights(seed)``, whatever the
number of ranks, and no rank holds more than one part in full at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

import torch

from xtrain.model.transformer import Transformer
from xtrain.parallel.tensors import assign_full, load_hf_sharded

Value = TypeVar("Value")


def materialize(model: Transformer, device: torch.device, *, seed: int, hf_path: Path | None = None) -> None:
    """Allocate ``model``'s (sharded) parameters on ``device``, then load them from the Hugging Face folder
    ``hf_path`` (one tensor at a time) or initialise them from ``seed``."""
    model.to_empty(device=device)
    if hf_path is not None:
        load_hf_sharded(model, hf_path)
    else:
        init_weights_sharded(model, seed)


@torch.no_grad()
def init_weights_sharded(model: Transformer, seed: int) -> None:
    """Initialise ``model`` (plain or sharded) exactly as ``Transformer.init_weights(seed)`` would unsharded."""
    device = next(model.parameters()).device
    with torch.device("meta"):
        twin = Transformer(model.config)
    for name in twin.init_part_names():
        part = twin.get_submodule(name)
        part.to_empty(device=device)
        twin.init_part(name, seed)
        targets = unwrapped_names(model.get_submodule(name).state_dict(keep_vars=True))
        for key, full in part.state_dict().items():
            assign_full(targets[key], full)
        part.to_empty(device="meta")  # frees the part before the next one is allocated


# Attributes under which wrappers keep the module they wrap: torch.compile's OptimizedModule, checkpoint_wrapper,
# FSDP1. They appear in state-dict keys (checkpoint_wrapper strips its own, OptimizedModule does not).
WRAPPER_ATTRIBUTES = ("_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module")


def unwrapped_names(state: Mapping[str, Value]) -> dict[str, Value]:
    """``state`` (tensors, gradients...) keyed as the unwrapped module would key it: wrapper attributes removed
    from the names."""
    return {
        ".".join(part for part in key.split(".") if part not in WRAPPER_ATTRIBUTES): value
        for key, value in state.items()
    }
