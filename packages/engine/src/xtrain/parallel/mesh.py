"""Every device mesh of a job, derived from its :class:`~xtrain.parallel.layout.ParallelLayout` by one function,
:func:`model_meshes`: the mesh of the dense (non-expert) parameters, and under expert parallelism the two the
experts need.

| layout | dense parameters | experts: split over | experts: FSDP over |
|---|---|---|---|
| plain FSDP | ``shard`` (1-D, all ranks) | | |
| HSDP | ``replicate × shard`` | | |
| EP | ``dp`` (1-D: ``fsdp × ep`` flattened) | ``ep`` | ``fsdp`` |
| EP + HSDP | ``replicate × dp`` (``dp``: ``fsdp × ep`` flattened) | ``ep`` | ``replicate × fsdp`` |

A 2-D FSDP mesh (replicate first) is HSDP: gradients reduce-scattered over the shard dimension, then all-reduced
over the replicas. Under EP all meshes are views of one root mesh (``[replicate ×] fsdp × ep``), which FSDP needs
to combine an expert parameter's ep split with its own sharding into one DTensor on ``[replicate ×] fsdp × ep``.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from xtrain.parallel.layout import ParallelLayout

SHARD_DIM = "shard"
REPLICATE_DIM = "replicate"
EXPERT_SHARD_DIM = "fsdp"
EXPERT_DIM = "ep"
ALL_RANKS_DIM = "dp"
"""Under EP: ``fsdp × ep`` flattened, the ranks of one replica group."""


@dataclass(frozen=True)
class ExpertParallelMesh:
    """The meshes of the expert parameters. Ep group ``g`` (the ranks with ep coordinate g) holds experts
    [g * E/ep, (g+1) * E/ep)."""

    experts: DeviceMesh
    """ep: the ranks that exchange tokens; expert parameters are sharded on the expert dimension over it."""
    expert_shard: DeviceMesh
    """fsdp, or replicate × fsdp (HSDP): the ranks that hold the same experts; FSDP shards (and reduces) the
    expert parameters over it."""

    @property
    def ep_size(self) -> int:
        return self.experts.size()


@dataclass(frozen=True)
class ModelMeshes:
    """What the model's parameters are spread over (every rank must build them: :func:`model_meshes`)."""

    dense: DeviceMesh
    """FSDP's mesh for every parameter except the experts': all ranks (1-D), or replicate × shard (HSDP)."""
    expert: ExpertParallelMesh | None
    """The experts' meshes; None without expert parallelism."""

    @property
    def expert_shard(self) -> DeviceMesh | None:
        """FSDP's mesh for the experts (``apply_fsdp``'s ``expert_mesh``); None without expert parallelism."""
        return self.expert.expert_shard if self.expert is not None else None


def model_meshes(layout: ParallelLayout, device_type: str) -> ModelMeshes:
    """The meshes of ``layout`` (checked by :func:`~xtrain.parallel.layout.check_layout`) over all ranks; a
    collective: every rank must call it. Rank order: replicate outermost, then shard, then ep (consecutive ranks
    share the fastest links: the per-layer collectives stay inside a replica group, the ep exchange on a node)."""
    if not layout.expert_parallel:
        return ModelMeshes(_data_parallel_mesh(layout, device_type), None)
    replicas = layout.replicate > 1
    names = ((REPLICATE_DIM,) if replicas else ()) + (EXPERT_SHARD_DIM, EXPERT_DIM)
    sizes = ((layout.replicate,) if replicas else ()) + (layout.shard, layout.ep)
    root = init_device_mesh(device_type, sizes, mesh_dim_names=names)
    # DeviceMesh has no public flatten or concatenate yet; torchtitan flattens the same way, and FSDP itself
    # concatenates (slicing a flattened dimension out of the root is deprecated).
    group = root[EXPERT_SHARD_DIM, EXPERT_DIM]._flatten(ALL_RANKS_DIM)
    if replicas:
        dense = DeviceMesh._concatenate([root[REPLICATE_DIM], group])
        expert_shard = root[REPLICATE_DIM, EXPERT_SHARD_DIM]
    else:
        dense, expert_shard = group, root[EXPERT_SHARD_DIM]
    return ModelMeshes(dense, ExpertParallelMesh(root[EXPERT_DIM], expert_shard))


def _data_parallel_mesh(layout: ParallelLayout, device_type: str) -> DeviceMesh:
    """``replicate`` groups, each holding one full copy of the model sharded over its ``shard`` ranks."""
    if layout.replicate == 1:
        return init_device_mesh(device_type, (layout.shard,), mesh_dim_names=(SHARD_DIM,))
    return init_device_mesh(device_type, (layout.replicate, layout.shard), mesh_dim_names=(REPLICATE_DIM, SHARD_DIM))
