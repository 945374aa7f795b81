"""Parallelism applied to a model from outside: the model files know nothing of it.

Where the processes go: ``layout.py`` holds a job's :class:`ParallelLayout` (replicate × shard × ep processes and
the processes per node), built and checked by :func:`check_layout` (the launcher, every rank and a planner call
it), and ``mesh.py`` derives every device mesh from it (:func:`model_meshes`: the dense parameters' mesh, plain
FSDP or HSDP, and under expert parallelism the experts' meshes). ``distributed.py`` starts the process group
(torchrun's environment, or one process).

One function per technique, applied in this order by the trainer (torchtitan's order):

1. ``apply_expert_parallel`` (expert_parallel.py): each MoE block's experts split over the ep ranks, and its
   tokens sent to their experts' ranks and back by all-to-all (all_to_all.py), optionally in Domino slices
   (``parallel.ep_size`` > 1 only).
2. ``apply_activation_checkpointing`` (checkpointing.py): the decoder layers a policy selects wrapped in
   non-reentrant checkpointing that saves the routing (and, under EP, replays the exchanges) (optional).
3. ``apply_activation_offload`` (offload.py): the checkpointed layers' checkpoints moved to host memory during
   forward and brought back one layer ahead in backward (optional).
4. ``apply_compile`` (compile.py): each decoder layer compiled on its own (optional).
5. ``apply_fsdp`` (fsdp.py): FSDP2 ``fully_shard`` per decoder layer, the embedding, the [final norm + output
   projection] group, then the root, over the dense mesh, and each MoE block's experts over theirs; mixed
   precision; explicit prefetch of the neighbouring layer.
6. ``materialize`` (materialize.py): parameters allocated on the device and initialised (or loaded from a Hugging
   Face folder) after sharding, so no rank ever holds the full model.

The names below are importable from here; each is loaded with its module on first use (``xtrain.config`` imports
a submodule of this package, so eager imports here would be circular). ``materialize`` is not among them: once
imported, its module of the same name takes its place as an attribute of this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xtrain.parallel.all_to_all import CommObserver
    from xtrain.parallel.checkpointing import apply_activation_checkpointing
    from xtrain.parallel.compile import apply_compile
    from xtrain.parallel.distributed import Distributed, close_distributed, init_distributed
    from xtrain.parallel.expert_parallel import ExchangeSpans, ExpertParallelSchedule, apply_expert_parallel
    from xtrain.parallel.fsdp import apply_fsdp
    from xtrain.parallel.layout import ParallelLayout, check_layout
    from xtrain.parallel.mesh import ExpertParallelMesh, ModelMeshes, model_meshes
    from xtrain.parallel.offload import apply_activation_offload

_HOMES = {
    "ParallelLayout": "layout",
    "check_layout": "layout",
    "ModelMeshes": "mesh",
    "ExpertParallelMesh": "mesh",
    "model_meshes": "mesh",
    "Distributed": "distributed",
    "init_distributed": "distributed",
    "close_distributed": "distributed",
    "apply_expert_parallel": "expert_parallel",
    "ExpertParallelSchedule": "expert_parallel",
    "ExchangeSpans": "expert_parallel",
    "CommObserver": "all_to_all",
    "apply_activation_checkpointing": "checkpointing",
    "apply_activation_offload": "offload",
    "apply_compile": "compile",
    "apply_fsdp": "fsdp",
}

__all__ = [
    "CommObserver",
    "Distributed",
    "ExchangeSpans",
    "ExpertParallelMesh",
    "ExpertParallelSchedule",
    "ModelMeshes",
    "ParallelLayout",
    "apply_activation_checkpointing",
    "apply_activation_offload",
    "apply_compile",
    "apply_expert_parallel",
    "apply_fsdp",
    "check_layout",
    "close_distributed",
    "init_distributed",
    "model_meshes",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
