"""Dropless routed experts in stages: permute the token-expert slots by expert, local experts on expert-sorted rows,
combine back per token.

Legend: T tokens, D hidden size, E experts (of this module: all of them, or this rank's share once an
expert-parallel step has split them), K experts per token, F expert hidden size, S token-expert slots in expert
order (T*K of this batch, or whatever rows an expert-parallel dispatch delivered).

The stages are separate so that code outside the model can take them apart (``xtrain.parallel.expert_parallel``
moves the sorted rows to the ranks that hold their experts between ``permute`` and ``compute``):

- ``forward(x_TD, weights_TK, experts_TK, counts_E)``: the whole chain on one device (permute → compute → combine);
- ``compute(x_SD, weight_S1, counts_E)``: the local experts on plain local tensors (torch's grouped matmul; the
  reference path: one matmul per expert, ``experts_impl="loop"``);
- ``forward_slices``: ``compute`` over several batches of rows in one module call, so that a wrapper that hooks
  module calls (FSDP's gather and gradient reduction) runs once for all of them.

Parameters may be DTensors after an expert-parallel step (sharded on the expert dimension): ``compute`` works on
their local part, duck-typed (``to_local``), so this package needs no torch.distributed.

Which path runs (:func:`choose_experts_path`, the table in docs/engine-moe.md): ``auto`` takes the fused CPU
loop (``cpu_fused``, cpu_experts.py) for the whole chain on the CPU in eager mode, torch's grouped matmul where
that kernel runs otherwise (accelerators, ``torch.compile``, expert-parallel rows), else the per-expert loop;
``MoEConfig.experts_impl`` forces one of the three.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import nn

from xtrain.model.moe.config import ExpertsImpl, MoEConfig
from xtrain.model.moe.cpu_experts import FusedExpertsCPU
from xtrain.model.moe.grouped_mm import GroupedImpl, grouped_mm, resolve_impl
from xtrain.model.moe.permute import WeightedSwiGLU, combine_rows, dispatch_rows, group_offsets, permute_slots

ExpertRows = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""One batch for ``compute``: rows x_SD sorted by (local) expert, their routing weights weight_S1, rows per
expert counts_E."""


ExpertsPath = Literal["cpu_fused", "grouped_mm", "loop"]
"""What computes the routed experts: the fused CPU loop, torch's grouped matmul, or one matmul per expert."""


def choose_experts_path(requested: ExpertsImpl, *, grouped: GroupedImpl, fusable: bool, where: str = "") -> ExpertsPath:
    """The path for a requested ``MoEConfig.experts_impl``.

    ``grouped``: what the grouped-matmul stage would use here (``resolve_impl``: ``grouped_mm`` where torch's kernel
    runs on this device, dtype and shapes, else ``loop``; it has already refused a forced ``grouped_mm`` that cannot
    run). ``fusable``: whether the fused CPU loop can run: the whole one-device chain, on the CPU, in eager mode,
    with whole unbiased experts. ``auto`` takes ``cpu_fused`` where fusable and the kernel runs (fp32, bf16, fp16
    with 16-byte aligned rows: the fastest on the CPU, and far smaller), else ``grouped``. A forced ``cpu_fused``
    that cannot run raises a ``ValueError`` naming ``where`` and the fix."""
    if requested == "cpu_fused":
        if not fusable:
            raise ValueError(
                f"experts_impl='cpu_fused' cannot run here ({where}): it needs the CPU in eager mode (no "
                "torch.compile), whole experts (no expert parallelism) and experts without biases; use "
                "experts_impl='auto', 'grouped_mm' or 'loop'"
            )
        return "cpu_fused"
    if requested == "auto" and fusable and grouped == "grouped_mm":
        return "cpu_fused"
    return grouped


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter sharded on the expert dimension (a DTensor's local tensor, differentiable),
    or the tensor itself."""
    to_local: Callable[[], torch.Tensor] | None = getattr(tensor, "to_local", None)
    return tensor if to_local is None else to_local()


class RoutedExperts(nn.Module, abc.ABC):
    """What both expert kinds share: the stage chain on one device and the sliced call; subclasses implement
    ``compute`` (abstract: the class itself cannot be built)."""

    config: MoEConfig
    gate_up_proj: nn.Parameter
    down_proj: nn.Parameter

    @abc.abstractmethod
    def compute(self, x_SD: torch.Tensor, weight_S1: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
        """Rows sorted by expert [S, D], their routing weights [S, 1], rows per expert [E] -> out_SD [S, D],
        already multiplied by the routing weight."""

    def impl_for(self, x: torch.Tensor) -> GroupedImpl:
        """The grouped-matmul implementation ``compute`` uses for this input (device, dtype, shapes)."""
        requested = self.config.experts_impl
        if requested == "cpu_fused":
            # compute() runs on rows someone else dispatched (expert parallelism), or for experts the fused loop
            # does not cover: a forced fused path cannot run there.
            choose_experts_path(requested, grouped="loop", fusable=False, where=self._where(x))
        gate_up, down = local_part(self.gate_up_proj), local_part(self.down_proj)
        first = resolve_impl(requested, x, gate_up.transpose(-2, -1))
        second = resolve_impl(requested, x, down.transpose(-2, -1))
        return "grouped_mm" if first == second == "grouped_mm" else "loop"

    def _where(self, x: torch.Tensor) -> str:
        return (
            f"{type(self).__name__} on {x.device.type}, {str(x.dtype).removeprefix('torch.')}, "
            f"torch.compile: {torch.compiler.is_compiling()}, "
            f"expert parallelism: {hasattr(self.gate_up_proj, 'to_local')}"
        )

    def forward(
        self,
        x: torch.Tensor,
        routing_weights: torch.Tensor,
        routed_experts: torch.Tensor,
        tokens_per_expert: torch.Tensor,
    ) -> torch.Tensor:
        """x [T, D], routing weights and expert ids [T, K], tokens per expert [E] -> y [T, D], on one device."""
        layout, weight_S1 = permute_slots(routed_experts, routing_weights)
        out_SD = self.compute(dispatch_rows(x, layout), weight_S1, tokens_per_expert)
        return combine_rows(out_SD, layout)

    def forward_slices(
        self,
        pending: Sequence[torch.Tensor],
        arrive: Callable[[int, torch.Tensor], ExpertRows],
        depart: Callable[[int, torch.Tensor], torch.Tensor],
    ) -> list[torch.Tensor]:
        """``compute`` over several batches, one after another, in one call: batch i is ``arrive(i, pending[i])``
        (the caller may wait for its rows there), its output goes to ``depart(i, out_SD)``, whose results are
        returned. ``pending`` holds what the batches are made from, as arguments, so that hooks on this call see
        the tensors the computation really consumes."""
        results = []
        for index, source in enumerate(pending):
            x_SD, weight_S1, counts_E = arrive(index, source)
            results.append(depart(index, self.compute(x_SD, weight_S1, counts_E)))
        return results


class GroupedExperts(RoutedExperts):
    """E SwiGLU experts stored as stacked tensors, computed dropless with grouped matmuls.

    Parameters (the layout transformers 5.x keeps in memory for Qwen3-MoE / DeepSeek-V3):
    `gate_up_proj` [E, 2F, D] (rows 0..F-1 the gate projection, F..2F-1 the up projection) and
    `down_proj` [E, D, F].
    """

    def __init__(self, hidden_size: int, config: MoEConfig) -> None:
        super().__init__()
        self.config = config
        e, f = config.num_experts, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * f, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(e, hidden_size, f))

    def path_for(self, x: torch.Tensor) -> ExpertsPath:
        """The path the one-device chain takes for this input (``choose_experts_path``)."""
        requested = self.config.experts_impl
        fusable = (
            x.device.type == "cpu"
            and not torch.compiler.is_compiling()
            and not hasattr(self.gate_up_proj, "to_local")  # whole experts only: not after expert parallelism
        )
        # The grouped stage's choice; a forced fused path needs none (its matmuls are plain ones).
        grouped = self.impl_for(x) if requested != "cpu_fused" else "loop"
        return choose_experts_path(requested, grouped=grouped, fusable=fusable, where=self._where(x))

    def forward(
        self,
        x: torch.Tensor,
        routing_weights: torch.Tensor,
        routed_experts: torch.Tensor,
        tokens_per_expert: torch.Tensor,
    ) -> torch.Tensor:
        """x [T, D], routing weights and expert ids [T, K], tokens per expert [E] -> y [T, D], on one device."""
        if self.path_for(x) != "cpu_fused":
            return super().forward(x, routing_weights, routed_experts, tokens_per_expert)
        # torch's CPU grouped matmul is itself a loop of one matmul per expert; the fused loop runs the same
        # matmuls for the three stages at once, without any S×D temporary (see cpu_experts.py).
        layout, weight_S1 = permute_slots(routed_experts, routing_weights)
        # Rows per expert as Python ints for the loop: tensor_split reads the (CPU) boundaries in C++, and the
        # pieces' lengths are shapes. This path runs on the CPU only: no device-to-host copy exists here.
        bounds = torch.cumsum(tokens_per_expert, dim=0)[:-1]
        counts = [piece.shape[0] for piece in torch.tensor_split(layout.token_S, bounds)]
        y: torch.Tensor = FusedExpertsCPU.apply(  # type: ignore[no-untyped-call]  # Function.apply is untyped
            x, weight_S1, self.gate_up_proj, self.down_proj, layout.token_S, counts
        )
        return y

    def compute(self, x_SD: torch.Tensor, weight_S1: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
        """Rows sorted by expert [S, D], their routing weights [S, 1], rows per expert [E] -> out_SD [S, D]."""
        impl = self.impl_for(x_SD)
        offsets_E = group_offsets(counts_E)
        gate_up_S2F = grouped_mm(x_SD, local_part(self.gate_up_proj).transpose(-2, -1), offsets_E, impl)
        # The routing weight scales the F-wide activation rather than the D-wide output: the same product
        # (the down projection is linear), a quarter of the elementwise work at F = D/4.
        h_SF: torch.Tensor = WeightedSwiGLU.apply(gate_up_S2F, weight_S1)  # type: ignore[no-untyped-call]  # Function.apply is untyped
        return grouped_mm(h_SF, local_part(self.down_proj).transpose(-2, -1), offsets_E, impl)
