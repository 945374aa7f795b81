"""What each rank saves into, and loads from, the DCP files of a checkpoint.

Keys (DCP flattens the nesting with dots): ``model.<parameter or buffer>`` and ``optim.<...>`` as
``torch.distributed.checkpoint.state_dict`` names them (global shapes, so DCP reshards to any world size and
HSDP shape), and ``rng.rank-R.cpu`` / ``rng.rank-R.<accelerator>``: each rank's own generator states. A tensor
that several ranks hold under one key is written once (DCP deduplicates replicated tensors), so states that differ
per rank need per-rank keys. The router's correction bias is a persistent buffer: it is in ``model.``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

RNG_PREFIX = "rng"


def rng_key(rank: int) -> str:
    return f"rank-{rank}"


def rng_states(device: torch.device) -> dict[str, torch.Tensor]:
    """This rank's generator states: the CPU one and, on an accelerator, that device's."""
    states = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def restore_rng_states(states: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(states["cpu"])
    if device.type == "cuda" and "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"], device)


def save_state(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int, device: torch.device) -> dict[str, Any]:
    """The state dict this rank hands to ``dcp.save``/``dcp.async_save`` (views of the live tensors: the async
    path copies them to host memory before returning)."""
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state, RNG_PREFIX: {rng_key(rank): rng_states(device)}}


def load_state(
    folder: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    rank: int,
    device: torch.device,
    saved_keys: set[str],
    process_group: dist.ProcessGroup | None,
) -> bool:
    """Load model, optimizer and this rank's RNG states from ``folder``, resharded to this run's mesh. Returns
    whether this rank found its own RNG states (a rank beyond the saving world keeps its seeded generators)."""
    model_state, optim_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optim": optim_state}
    own = {
        name: template
        for name, template in rng_states(device).items()
        if f"{RNG_PREFIX}.{rng_key(rank)}.{name}" in saved_keys
    }
    if own:
        state[RNG_PREFIX] = {rng_key(rank): own}
    dcp_load(state, checkpoint_id=folder, process_group=process_group)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if own:
        restore_rng_states(state[RNG_PREFIX][rng_key(rank)], device)
    return "cpu" in own
