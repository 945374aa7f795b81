"""The parallel layout of a job: its processes split into named dimensions, built and checked in one place.

A job of W processes is a grid ``replicate × shard × ep = W``, outermost dimension first in rank order
(rank r = (i · shard + f) · ep + e):

- ``replicate`` (``parallel.replicate``): replica groups, each holding one full copy of the model (HSDP); the
  gradients are all-reduced across replicas once per step. Outermost: a replica group's ranks are consecutive,
  so replicas span nodes while the per-layer collectives stay inside a group.
- ``shard``: the FSDP dimension inside a replica group: the ranks that hold the same experts shard them.
- ``ep`` (``parallel.ep_size``): expert parallelism, innermost: the ep ranks of one group are consecutive, hence
  on one node (``ep`` must divide the processes per node), and exchange tokens by all-to-all every MoE layer.

What each kind of parameter is spread over (the meshes of :func:`xtrain.parallel.mesh.model_meshes`):

- every parameter except the experts': FSDP over ``shard × ep`` (flattened), replicated over ``replicate``
  (HSDP when ``replicate`` > 1, plain FSDP over all ranks otherwise);
- the experts' (ep > 1): split on the expert dimension over ``ep``, FSDP over ``shard``, replicated over
  ``replicate``.

:func:`check_layout` is the one function that builds a layout from ``[parallel]`` and the job's size and refuses
one that cannot run (a ConfigError naming the values). It is pure arithmetic, with no process group, so the
launcher calls it before any process starts, every rank calls it before building its meshes, and a planner can
call it for jobs that do not exist yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from xtrain.errors import ConfigError

if TYPE_CHECKING:  # xtrain.config imports this package: only the type here
    from xtrain.config import ParallelSection


@dataclass(frozen=True)
class ParallelLayout:
    """The named dimensions of a job (``replicate × shard × ep`` processes, in rank order) and the processes per
    node. Build it with :func:`check_layout`; every device mesh of the job is derived from it
    (:func:`xtrain.parallel.mesh.model_meshes`)."""

    replicate: int
    """HSDP replica groups (1: no replicas)."""
    shard: int
    """FSDP ranks inside a replica group that hold the same experts (all of the group's ranks without EP)."""
    ep: int
    """Expert-parallel ranks: each holds 1/ep of every MoE layer's experts (1: off)."""
    processes_per_node: int

    @property
    def world_size(self) -> int:
        return self.replicate * self.shard * self.ep

    @property
    def dense_shard(self) -> int:
        """The ranks over which FSDP shards every non-expert parameter: a whole replica group."""
        return self.shard * self.ep

    @property
    def expert_parallel(self) -> bool:
        return self.ep > 1


def check_layout(
    parallel: ParallelSection, world_size: int, processes_per_node: int | None = None, num_experts: int | None = None
) -> ParallelLayout:
    """The layout of a job of ``world_size`` processes under ``parallel``, or a ConfigError naming the values.

    ``processes_per_node`` None: all on one node. ``num_experts``: the model's experts per MoE layer (None: a
    dense model); read only when ``parallel.ep_size`` > 1."""
    per_node = world_size if processes_per_node is None else processes_per_node
    replicate, ep = parallel.replicate, parallel.ep_size
    if replicate < 1 or world_size % replicate:
        raise ConfigError(f"parallel.replicate = {replicate} must divide the number of processes ({world_size})")
    if ep < 1:
        raise ConfigError(f"parallel.ep_size = {ep} must be at least 1 (1 turns expert parallelism off)")
    if ep > 1:
        _check_expert_parallel(world_size, per_node, num_experts, ep, replicate)
    return ParallelLayout(replicate, world_size // (replicate * ep), ep, per_node)


def _check_expert_parallel(world_size: int, per_node: int, num_experts: int | None, ep: int, replicate: int) -> None:
    replicas = f"parallel.replicate = {replicate}, " if replicate > 1 else ""
    where = (
        f"parallel.ep_size = {ep} with {replicas}{world_size} processes ({per_node} per node) and "
        f"{num_experts if num_experts is not None else 'no'} experts"
    )
    if num_experts is None:
        raise ConfigError(f"{where}: the model has no MoE layer, so there are no experts to split; set ep_size 1")
    if world_size % ep:
        raise ConfigError(f"{where}: ep_size must divide the number of processes")
    if (world_size // replicate) % ep:
        raise ConfigError(
            f"{where}: replicate * ep_size = {replicate * ep} must divide the number of processes (each replica "
            "group holds whole ep groups)"
        )
    if per_node % ep:
        raise ConfigError(
            f"{where}: ep_size must divide the processes per node (expert parallelism stays inside a node)"
        )
    if num_experts % ep:
        raise ConfigError(f"{where}: ep_size must divide the number of experts (each rank holds experts / ep_size)")
