"""Per-block torch.compile: each decoder layer compiled on its own, in place.

Apply it after activation checkpointing and offload, before FSDP. Compiling layer by layer keeps graphs small
and identical across layers (one compilation serves every layer of the same kind: a dense and an MoE layer make
two), and leaves FSDP's per-layer hooks outside the compiled code.
``Module.compile`` compiles the module's call in place, so the layer keeps its class and its parameter names
(checkpoints and FSDP see the same module tree).

A layer compiles with ``fullgraph=True`` and once for all packs of the same row length: the attention reads the
document boundaries as a tensor, never as Python ints (see :mod:`xtrain.model.document_sdpa`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xtrain.model.transformer import Transformer
from xtrain.parallel.offload import offloaded_layer


def apply_compile(
    model: Transformer, *, fullgraph: bool = True, backend: str | Callable[..., Any] = "inductor"
) -> None:
    """Compile every decoder layer of ``model`` (before FSDP is applied).

    ``backend`` is torch.compile's: tests pass ``"aot_eager"`` (the same graph capture and guards as inductor,
    without code generation) or a counting backend.
    """
    for layer in model.layers:
        # An offloaded layer runs its checkpoint inside autograd's saved-tensor hooks, which dynamo does not
        # trace: it compiles the layer inside the checkpoint (a plain checkpointed layer compiles with it).
        inner = offloaded_layer(layer)
        (inner if inner is not None else layer).compile(fullgraph=fullgraph, backend=backend)
