"""The data-parallel device mesh: plain FSDP (one "shard" dimension) or HSDP ("replicate" × "shard")."""

from __future__ import annotations

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
