"""What every rank runs for the sharded tests: one job per world size, many checks per job (spawning processes
costs seconds each on two cores). The jobs build sharded models exactly as the trainer does (meta device →
optional activation checkpointing → apply_fsdp → materialize) and return plain tensors; the tests compare them
with unsharded references built in the test process.

Each check's result is stored under its name; a check that raises stores its traceback instead (``"error"``), so
one broken behaviour fails its own test and the other checks still run. Tensors that are the same on every rank
(gathered full tensors) come back from rank 0 only.
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from xtrain.config import ParallelSection
from xtrain.loss import peak_allocated_bytes
from xtrain.model.config import ModelConfig
from xtrain.model.hf import read_hf_config
from xtrain.model.moe.router import Router
from xtrain.model.transformer import Transformer
from xtrain.parallel.checkpointing import apply_activation_checkpointing
from xtrain.parallel.distributed import close_distributed, init_distributed
from xtrain.parallel.fsdp import apply_fsdp
from xtrain.parallel.layout import check_layout
from xtrain.parallel.materialize import materialize, unwrapped_names
from xtrain.parallel.mesh import model_meshes
from xtrain.parallel.tensors import full_tensor, save_hf_sharded

from .tiny import SEED, inputs_of_rank, logits_head, set_router_biases, sigmoid_moe_config, training_loss

Result = dict[str, Any]


@dataclass(frozen=True)
class HFFolders:
    """Checkpoint folders written by transformers in the test process, and where the jobs write theirs."""

    dense: str
    moe: str
    out: str


def two_rank_job(folders: HFFolders) -> dict[str, Result]:
    rank = start_gloo()
    mesh = model_meshes(check_layout(ParallelSection(), 2), "cpu").dense
    config = sigmoid_moe_config()
    checks: dict[str, Callable[[], Result]] = {
        "init": lambda: _init(config, mesh),
        "forward fp32": lambda: _forward(config, mesh, torch.float32, reshard=True),
        "forward fp32 no reshard": lambda: _forward(config, mesh, torch.float32, reshard=False),
        "forward bf16": lambda: _forward(config, mesh, torch.bfloat16, reshard=True),
        "gradients checkpointed": lambda: _gradients_checkpointed(config, mesh),
        "all-gathers of a step": lambda: _all_gathers_of_a_step(config, mesh),
        "load dense": lambda: _load_hf(Path(folders.dense), mesh),
        "load moe": lambda: _load_hf(Path(folders.moe), mesh),
        "save moe": lambda: _save_hf(Path(folders.moe), mesh, Path(folders.out) / "saved-moe"),
        "dcp": lambda: _dcp_round_trip(config, mesh, Path(folders.out) / "dcp"),
    }
    return run_checks(rank, checks)


def four_rank_job() -> dict[str, Result]:
    rank = start_gloo()
    fsdp = model_meshes(check_layout(ParallelSection(), 4), "cpu").dense
    hsdp = model_meshes(check_layout(ParallelSection(replicate=2), 4), "cpu").dense
    untied, tied = sigmoid_moe_config(), sigmoid_moe_config(tie=True)
    checks: dict[str, Callable[[], Result]] = {
        "init fsdp": lambda: _init(untied, fsdp),
        "init hsdp": lambda: _init(untied, hsdp),
        "forward hsdp tied": lambda: _forward(tied, hsdp, torch.float32, reshard=True),
    }
    return run_checks(rank, checks)


def start_gloo() -> int:
    # A short timeout: a check that fails on one rank must not leave the others waiting for half an hour.
    dist.init_process_group("gloo", timeout=timedelta(seconds=90))
    return init_distributed("cpu").rank


def run_checks(rank: int, checks: dict[str, Callable[[], Result]]) -> dict[str, Result]:
    results: dict[str, Result] = {}
    for name, check in checks.items():
        try:
            results[name] = check()
        except Exception:
            results[name] = {"error": f"rank {rank}: {traceback.format_exc()}"}
    close_distributed()
    return results


def _sharded(
    config: ModelConfig,
    mesh: DeviceMesh,
    *,
    param_dtype: torch.dtype = torch.float32,
    reshard: bool = True,
    checkpointing: str | None = None,
    seed: int = SEED,
    hf_path: Path | None = None,
) -> Transformer:
    """The trainer's order (train/build.py build_model): meta → checkpointing → FSDP2 → materialise."""
    with torch.device("meta"):
        model = Transformer(config)
    if checkpointing is not None:
        apply_activation_checkpointing(model, checkpointing)
    apply_fsdp(model, mesh, param_dtype=param_dtype, reshard_after_forward=reshard)
    materialize(model, torch.device("cpu"), seed=seed, hf_path=hf_path)
    return model


def _gathered(model: Transformer) -> dict[str, Tensor]:
    """Every parameter and buffer in full (a collective), keyed as the unwrapped, unsharded model keys them."""
    state = {name: full_tensor(tensor.detach()).clone() for name, tensor in model.state_dict().items()}
    return unwrapped_names(state)


def _on_rank0(value: Any) -> Any:
    return value if dist.get_rank() == 0 else None


def _init(config: ModelConfig, mesh: DeviceMesh) -> Result:
    model = _sharded(config, mesh)
    # The checkpoint-wrapped variant also shows that initialisation looks through wrappers (FSDP's class swap
    # of every layer, and checkpoint_wrapper around them).
    wrapped = _sharded(config, mesh, checkpointing="full")
    result = {"state": _on_rank0(_gathered(model)), "wrapped state": _on_rank0(_gathered(wrapped))}
    try:
        model.init_weights(SEED)  # in place on the shards: must refuse, not initialise wrongly
        result["init_weights on shards"] = ""
    except TypeError as error:
        result["init_weights on shards"] = str(error)
    return result


def _forward(config: ModelConfig, mesh: DeviceMesh, param_dtype: torch.dtype, *, reshard: bool) -> Result:
    model = _sharded(config, mesh, param_dtype=param_dtype, reshard=reshard)
    set_router_biases(model)
    seen: list[tuple[torch.dtype, torch.dtype, bool]] = []

    def record_router_dtypes(router: torch.nn.Module, _: Any) -> None:
        bias = router.e_score_correction_bias
        seen.append((router.weight.dtype, bias.dtype, isinstance(bias, DTensor)))

    for module in model.modules():
        if isinstance(module, Router):
            module.register_forward_pre_hook(record_router_dtypes)
    input_ids_1T, cu_seqlens = inputs_of_rank(dist.get_rank(), config.vocab_size)
    with torch.no_grad():
        logits_TV, stats = model.forward_with_head(input_ids_1T, cu_seqlens, head=logits_head)
        hidden_1TD = model.forward_hidden(input_ids_1T, cu_seqlens).hidden
    return {
        "logits": logits_TV,
        "hidden": hidden_1TD.float(),
        "tokens_per_expert": [s.tokens_per_expert for s in stats],
        "router dtypes in forward": seen,
    }


def _gradients_checkpointed(config: ModelConfig, mesh: DeviceMesh) -> Result:
    model = _sharded(config, mesh, checkpointing="full")
    set_router_biases(model)
    input_ids_1T, cu_seqlens = inputs_of_rank(dist.get_rank(), config.vocab_size)
    training_loss(model, input_ids_1T, cu_seqlens).backward()  # type: ignore[no-untyped-call]
    grads = {name: None if p.grad is None else full_tensor(p.grad).clone() for name, p in model.named_parameters()}
    return {"grads": _on_rank0(unwrapped_names(grads))}


def _all_gathers_of_a_step(config: ModelConfig, mesh: DeviceMesh) -> Result:
    """How many times FSDP all-gathers each group in one forward and backward with the router losses (FSDP's own
    profiler annotations, ``FSDP::all_gather (GROUP)``)."""
    model = _sharded(config, mesh)
    set_router_biases(model)
    input_ids_1T, cu_seqlens = inputs_of_rank(dist.get_rank(), config.vocab_size)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        training_loss(model, input_ids_1T, cu_seqlens).backward()  # type: ignore[no-untyped-call]
    prefix = "FSDP::all_gather ("
    events = profiler.events()
    counts = Counter(
        event.name.removeprefix(prefix).removesuffix(")") for event in events if event.name.startswith(prefix)
    )
    return {"counts": dict(counts), "layers": config.num_layers}


def _load_hf(folder: Path, mesh: DeviceMesh) -> Result:
    config = read_hf_config(folder)
    with torch.device("meta"):
        model = Transformer(config)
    apply_fsdp(model, mesh, param_dtype=torch.float32)
    peak = peak_allocated_bytes(lambda: materialize(model, torch.device("cpu"), seed=0, hf_path=folder))
    full_bytes = [t.numel() * t.element_size() for t in model.state_dict().values()]  # DTensor: the global size
    input_ids_1T, cu_seqlens = inputs_of_rank(dist.get_rank(), config.vocab_size)
    with torch.no_grad():
        logits_TV, _ = model.forward_with_head(input_ids_1T, cu_seqlens, head=logits_head)
    return {"peak": peak, "model bytes": sum(full_bytes), "largest tensor bytes": max(full_bytes), "logits": logits_TV}


def _save_hf(like: Path, mesh: DeviceMesh, out: Path) -> Result:
    # Seeded weights, not the folder's: what transformers reads back can only come from this save.
    model = _sharded(read_hf_config(like), mesh, seed=11)
    save_hf_sharded(model, out)
    return {}


def _dcp_round_trip(config: ModelConfig, mesh: DeviceMesh, folder: Path) -> Result:
    saved = _sharded(config, mesh, seed=1)
    set_router_biases(saved)  # the restored model keeps zero biases until the load: buffers must come back too
    dcp.save(get_model_state_dict(saved), checkpoint_id=str(folder))
    restored = _sharded(config, mesh, seed=2)
    before = _local_state(restored)
    state = get_model_state_dict(restored)
    dcp.load(state, checkpoint_id=str(folder))
    set_model_state_dict(restored, state)
    want, got = _local_state(saved), _local_state(restored)
    return {
        "keys": sorted(want),
        "different after load": sorted(key for key in want if not torch.equal(got[key], want[key])),
        "equal before load": sorted(key for key in want if torch.equal(before[key], want[key])),
    }


def _local_state(model: Transformer) -> dict[str, Tensor]:
    """This rank's own shards (no communication): what must come back bit for bit."""
    return {
        name: (tensor.to_local() if isinstance(tensor, DTensor) else tensor).detach().clone()
        for name, tensor in model.state_dict().items()
    }
