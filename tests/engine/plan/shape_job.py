"""What every rank runs for test_shapes: the model sharded as the trainer shards it, under several layouts, and
the padded shard sizes FSDP2 gave each of its groups."""

from __future__ import annotations

import torch
from torch.distributed.fsdp import FSDPModule
from xtrain.config import ParallelSection
from xtrain.model.sizes import model_config
from xtrain.model.transformer import Transformer
from xtrain.parallel.expert_parallel import apply_expert_parallel
from xtrain.parallel.fsdp import apply_fsdp
from xtrain.parallel.layout import check_layout
from xtrain.parallel.mesh import model_meshes

from tests.engine.parallel.jobs import start_gloo

LAYOUTS = [
    {"replicate": 1, "ep_size": 1},
    {"replicate": 2, "ep_size": 1},
    {"replicate": 1, "ep_size": 2},
    {"replicate": 2, "ep_size": 2},
]


def padded_group_sizes() -> list[dict[str, int]]:
    """Per layout: the elements of this rank's padded shard, by FSDP group (named by its module's path)."""
    start_gloo()
    model = model_config("debug").model_copy(update={"vocab_size": 510})  # rows that do not divide evenly
    found = []
    for settings in LAYOUTS:
        layout = check_layout(ParallelSection(**settings), 4, 4, model.moe.num_experts if model.moe else None)
        meshes = model_meshes(layout, "cpu")
        with torch.device("meta"):
            net = Transformer(model)
        if layout.expert_parallel:
            apply_expert_parallel(net, meshes.expert)
        apply_fsdp(net, meshes.dense, param_dtype=torch.float32, expert_mesh=meshes.expert_shard)
        sizes: dict[str, int] = {}
        seen: set[int] = set()
        for name, module in net.named_modules():
            group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, FSDPModule) else None
            if group is not None and id(group) not in seen:
                seen.add(id(group))
                sizes[_planner_name(name)] = sum(p.padded_sharded_param_size.numel() for p in group.fsdp_params)
        found.append(sizes)
    return found


def _planner_name(module_path: str) -> str:
    """The name xtrain.plan.shapes gives the group of the module at this path."""
    if module_path == "":
        return "root"
    if module_path in ("norm", "lm_head"):
        return "head"
    if module_path.startswith("layers.") and module_path.endswith(".experts"):
        return ".".join(module_path.split(".")[:2]) + ".experts"
    return module_path
