"""Device meshes: the data-parallel one (plain FSDP, one "shard" dimension, or HSDP "replicate" × "shard"), and the
2-D one of expert parallelism (fsdp × ep, see ``ExpertParallelMesh``)."""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from xtrain.errors import ConfigError

SHARD_DIM = "shard"
REPLICATE_DIM = "replicate"


def data_parallel_mesh(device_type: str, world_size: int, replicate: int) -> DeviceMesh:
    """A mesh over all ranks: ``replicate`` groups, each holding one full copy of the model sharded over
    ``world_size / replicate`` ranks. Ranks of one shard group are consecutive, so on a node they share the
    fastest links (the shard group's collectives run every layer; the replicate all-reduce once per step)."""
    if replicate < 1 or world_size % replicate:
        raise ConfigError(
            f"parallel.replicate = {replicate} must divide the world size {world_size} (processes in the job)"
        )
    if replicate == 1:
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=(SHARD_DIM,))
    return init_device_mesh(
        device_type, (replicate, world_size // replicate), mesh_dim_names=(REPLICATE_DIM, SHARD_DIM)
    )


EXPERT_SHARD_DIM = "fsdp"
EXPERT_DIM = "ep"
ALL_RANKS_DIM = "dp"


@dataclass(frozen=True)
class ExpertParallelMesh:
    """The 2-D mesh (fsdp × ep) of expert parallelism and the views of it each kind of parameter uses.

    Ranks r = f * ep_size + e: the ep ranks of one group are consecutive, hence on one node. Expert e-group
    ``e`` (the ranks with ep coordinate e) holds experts [e * E/ep, (e+1) * E/ep)."""

    root: DeviceMesh
    """(fsdp, ep)."""
    experts: DeviceMesh
    """ep: the ranks that exchange tokens; expert parameters are sharded on the expert dimension over it."""
    expert_shard: DeviceMesh
    """fsdp: the ranks that hold the same experts; FSDP shards (and reduces) expert parameters over it."""
    all_ranks: DeviceMesh
    """fsdp × ep flattened: FSDP shards (and reduces) every other parameter over all ranks."""

    @property
    def ep_size(self) -> int:
        return self.experts.size()


def check_expert_parallel(
    world_size: int, processes_per_node: int, num_experts: int | None, ep_size: int, replicate: int = 1
) -> None:
    """Refuse an expert-parallel layout that cannot run, with one message naming the values (ConfigError).

    Pure arithmetic, no process group: callable before anything starts. ``num_experts`` None: a dense model."""
    if ep_size < 1:
        raise ConfigError(f"parallel.ep_size = {ep_size} must be at least 1 (1 turns expert parallelism off)")
    if ep_size == 1:
        return
    where = (
        f"parallel.ep_size = {ep_size} with {world_size} processes ({processes_per_node} per node) and "
        f"{num_experts if num_experts is not None else 'no'} experts"
    )
    if num_experts is None:
        raise ConfigError(f"{where}: the model has no MoE layer, so there are no experts to split; set ep_size 1")
    if replicate != 1:
        raise ConfigError(f"{where}: expert parallelism does not combine with parallel.replicate = {replicate} (HSDP)")
    if world_size % ep_size:
        raise ConfigError(f"{where}: ep_size must divide the number of processes")
    if processes_per_node % ep_size:
        raise ConfigError(
            f"{where}: ep_size must divide the processes per node (expert parallelism stays inside a node)"
        )
    if num_experts % ep_size:
        raise ConfigError(f"{where}: ep_size must divide the number of experts (each rank holds experts / ep_size)")


def expert_parallel_mesh(
    device_type: str, world_size: int, processes_per_node: int, num_experts: int | None, ep_size: int
) -> ExpertParallelMesh:
    """The (fsdp × ep) mesh over all ranks, after :func:`check_expert_parallel` (every rank must call it)."""
    check_expert_parallel(world_size, processes_per_node, num_experts, ep_size)
    root = init_device_mesh(
        device_type, (world_size // ep_size, ep_size), mesh_dim_names=(EXPERT_SHARD_DIM, EXPERT_DIM)
    )
    # DeviceMesh has no public flatten yet; torchtitan uses the same call for its flattened data-parallel mesh.
    all_ranks = root[EXPERT_SHARD_DIM, EXPERT_DIM]._flatten(ALL_RANKS_DIM)
    return ExpertParallelMesh(root, root[EXPERT_DIM], root[EXPERT_SHARD_DIM], all_ranks)
