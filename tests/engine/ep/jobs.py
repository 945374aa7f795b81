"""What every rank runs for the expert-parallel tests: one job per world size, many checks per job (spawning
processes costs seconds each on two cores). Each check builds the same model under several layouts (ep_size 1 is
plain FSDP over all ranks) and returns the global losses, the router counts and every gradient in full; the
tests compare the layouts. A check that raises stores its traceback instead (``"error"``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard import _fsdp_param_group
from xtrain.model.config import ModelConfig
from xtrain.model.documents import PackedDocuments
from xtrain.model.transformer import Transformer
from xtrain.parallel.materialize import unwrapped_names
from xtrain.parallel.tensors import full_tensor
from xtrain.train.step import GlobalBatch, LossSettings, MicroBatch, train_step

from ..parallel.jobs import run_checks, start_gloo
from .models import TOKENS, build, inputs_of_rank, moe_config, step_results

Result = dict[str, Any]
Layout = tuple[int, int]  # (ep_size, domino_slices)

REPLICATED = {
    "fsdp": {},
    "hsdp": {"replicate": 2},
    "hsdp ep 2": {"replicate": 2, "ep_size": 2},
    "hsdp ep 2 domino": {"replicate": 2, "ep_size": 2, "domino_slices": 2},
}
"""Four ranks: plain FSDP, HSDP 2 × 2, and HSDP replicas whose experts are split over ep 2 inside each replica."""


def two_rank_job() -> dict[str, Result]:
    rank = start_gloo()
    config = moe_config()
    checks: dict[str, Callable[[], Result]] = {
        "layouts": lambda: _layouts(config, [(1, 1), (2, 1), (2, 3)]),
        "biased experts": lambda: _layouts(moe_config(router="topk_softmax", biased=True), [(1, 1), (2, 2)]),
        "uneven load": lambda: _layouts(config, [(1, 1), (2, 1), (2, 3)], prepare=_skewed_router),
        "reductions": lambda: _reductions(config),
        "train_step": lambda: _train_steps(config, {"1x1": {}, "2x2": {"ep_size": 2, "domino_slices": 2}}),
        "checkpointed": lambda: _checkpointed(config),
    }
    return run_checks(rank, checks)


def four_rank_job() -> dict[str, Result]:
    rank = start_gloo()
    config = moe_config()
    checks: dict[str, Callable[[], Result]] = {
        "layouts": lambda: _layouts(config, [(1, 1), (2, 3), (4, 2)]),
        "uneven load": lambda: _layouts(config, [(1, 1), (4, 2)], prepare=_skewed_router),
        "replicas": lambda: _train_steps(config, REPLICATED),
    }
    return run_checks(rank, checks)


def _skewed_router(model: Transformer) -> None:
    """Correction biases that send every token of every rank to experts 0-3 (group 0), so that the ranks holding
    experts 4-7 receive no row at all; rank 1's tokens all pick experts 0 and 1, so experts 2 and 3 receive rows
    from rank 0 only (and, at ep 4, each rank's slices differ)."""
    rank = dist.get_rank()
    with torch.no_grad():
        for name, bias in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                values = torch.tensor([5.0, 5.0, 5.0, 5.0, 0.0, 0.0, 0.0, 0.0])
                if rank == 1:
                    values[:2] += 5.0
                bias.copy_(values)


def _layouts(
    config: ModelConfig, layouts: list[Layout], prepare: Callable[[Transformer], None] | None = None
) -> Result:
    input_ids_1T, cu_seqlens = inputs_of_rank(dist.get_rank(), config.vocab_size)
    per_layout: dict[Layout, Any] = {}
    for ep_size, slices in layouts:
        model = build(config, ep_size, domino_slices=slices, prepare=prepare)
        per_layout[(ep_size, slices)] = step_results(model, input_ids_1T, cu_seqlens)
    # Full results from rank 0 (the same on every rank); every rank's own router counts.
    return {
        "layouts": per_layout if dist.get_rank() == 0 else None,
        "local counts": {layout: result["local counts"] for layout, result in per_layout.items()},
    }


class _Waits:
    """Counts the exchanges a rank waited for, by name (told synchronously, in the waiting thread)."""

    def __init__(self) -> None:
        self.names: Counter[str] = Counter()

    def exchanged(self, name: str, launch_ns: int, done_ns: int, nbytes: int) -> None:
        pass

    def waited(self, name: str, start_ns: int, end_ns: int) -> None:
        self.names[name] += 1


def _checkpointed(config: ModelConfig) -> Result:
    """Every layer checkpointed under EP with Domino slices: the results of the plain model, and the exchanges
    each rank waited for in one forward and backward (a recompute that communicated would wait for its own)."""
    input_ids_1T, cu_seqlens = inputs_of_rank(dist.get_rank(), config.vocab_size)
    waits = _Waits()
    per_layout: dict[str, Any] = {}
    for name, ep_size, slices, policy, observer in (
        ("plain", 1, 1, "none", None),
        ("ep 2 checkpointed", 2, 3, "full", waits),
    ):
        model = build(config, ep_size, domino_slices=slices, observer=observer, checkpointing=policy)
        per_layout[name] = step_results(model, input_ids_1T, cu_seqlens)
    return {"layouts": per_layout if dist.get_rank() == 0 else None, "waits": dict(waits.names)}


def _reductions(config: ModelConfig) -> Result:
    """Gradient reductions (FSDP's reduce-scatter of one group, or its local division on a one-rank group) in one
    backward, by layout: Domino's slices must not multiply them. Counted by wrapping FSDP's function, which still
    runs."""
    input_ids_1T, cu_seqlens = inputs_of_rank(dist.get_rank(), config.vocab_size)
    counted: dict[str, int] = {}
    for ep_size, slices in ((2, 1), (2, 3)):
        model = build(config, ep_size, domino_slices=slices)
        calls: list[int] = []
        original = _fsdp_param_group.foreach_reduce

        def counting(*args: Any, original: Any = original, calls: list[int] = calls, **kwargs: Any) -> Any:
            calls.append(1)
            return original(*args, **kwargs)

        _fsdp_param_group.foreach_reduce = counting
        try:
            step_results(model, input_ids_1T, cu_seqlens)
        finally:
            _fsdp_param_group.foreach_reduce = original
        counted[f"ep {ep_size} slices {slices}"] = len(calls)
    return counted


def _train_steps(config: ModelConfig, layouts: dict[str, dict[str, int]]) -> Result:
    """The trainer's own step (losses over the global batch, router bias update, clipping) under each layout
    (``build``'s keywords: ep_size, domino_slices, replicate)."""
    world = dist.get_world_size()
    input_ids_1T, cu_seqlens = inputs_of_rank(dist.get_rank(), config.vocab_size)
    batch = MicroBatch(
        input_ids=input_ids_1T,
        labels=torch.roll(input_ids_1T[0], -1),
        documents=PackedDocuments.from_lengths(torch.diff(cu_seqlens).tolist(), torch.device("cpu")),
    )
    settings = LossSettings(chunk_tokens=8, aux_loss_coef=0.1, z_loss_coef=0.01, max_grad_norm=0.05)
    out: dict[str, Any] = {}
    for name, layout in layouts.items():
        model = build(config, **layout)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        step = train_step(
            model,
            optimizer,
            [batch],
            GlobalBatch(target_tokens=TOKENS * world, routed_tokens=TOKENS * world),
            settings,
            dp_size=world,
        )
        state = {name: full_tensor(t.detach()).clone() for name, t in model.state_dict().items()}
        out[name] = {"step": step, "state": unwrapped_names(state) if dist.get_rank() == 0 else None}
    return out
