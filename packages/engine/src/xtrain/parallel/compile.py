"""Per-block torch.compile: each decoder layer compiled on its own, in place.

Compiling layer by layer keeps graphs small and identical across layers (one compilation serves them all), and
leaves FSDP's per-layer hooks outside the compiled code. ``Module.compile`` compiles the module's call in place,
so the layer keeps its class and its parameter names (checkpoints and FSDP see the same module tree).
"""

from __future__ import annotations

from xtrain.model.transformer import Transformer


def apply_compile(model: Transformer, *, fullgraph: bool = True) -> None:
    """Compile every decoder layer of ``model`` (before FSDP is applied)."""
    for layer in model.layers:
        layer.compile(fullgraph=fullgraph)
