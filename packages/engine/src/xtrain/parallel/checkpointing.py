"""Activation checkpointing applied from outside, per decoder layer: recompute a layer's activations in backward
instead of keeping them.

Always the non-reentrant implementation (``use_reentrant=False``): the reentrant one runs the layer inside an
autograd Function that only tracks the tensors it returns directly, and a decoder layer returns its router
statistics inside a dataclass, so the load-balancing and z-losses built from them would get no gradient,
silently. Non-reentrant checkpointing gives exactly the gradients of the plain model.

The routing is never recomputed. The checkpoint is selective on one kind of operator: the outputs of
``aten.topk`` (the router's expert choice, and the group choice of group-limited routing) are saved in forward
and replayed in the recompute. On a GPU, a recompute can differ from the forward in the last bits (kernels that
accumulate atomically, autotuning picking another kernel), and a router score that moves by one ulp can flip a
top-k tie and send a token to another expert in backward than in forward: gradients of the wrong expert, or a
shape mismatch. With the choice saved, the recompute follows the forward's routing by construction. What is
saved is small (top-k values and indices: tokens × k per layer).

Under expert parallelism (``apply_expert_parallel`` applied first) the token exchanges are not recomputed either.
A checkpointed layer whose MoE blocks exchange tokens runs under a pair of dispatch modes of its own instead of
SAC's: its forward keeps the top-k outputs as above and records every all-to-all's receive buffer on a tape
(``parallel.all_to_all.ExchangeTape``); its recompute replays both, so it runs no collective, and backward runs only
the gradient all-to-alls, as without checkpointing. Why not SAC: c10d's all-to-all fills a buffer in place and
returns a Work handle, which SAC's op cache cannot replay; and SAC's recompute insists that every operator repeat
the forward's, while the experts' FSDP group, nested inside the layer, all-gathers in forward and not in the
recompute. What the tape keeps, per checkpointed MoE layer and micro-batch, until the layer's backward: the
dispatched rows with their weight column ([R, D+1], R ≈ T·K on average) and the combined rows ([T·K, D]) in the
compute dtype, about 2·K times the layer's checkpointed input [T, D], plus the counts.

Policies (a string, as ``memory.checkpointing`` spells them):

- ``none``: no layer is checkpointed;
- ``full``: every layer;
- ``every:K``: layers 0, K, 2K, ... (every K-th layer, K ≥ 1);
- ``ratio:F``: the first round(F × layers) layers (0 ≤ F ≤ 1). The first layers, because their checkpoints are
  the ones that stay longest in memory (forward keeps them until backward comes back to the bottom).

Apply it on the model built on the meta device, before ``apply_activation_offload``, ``apply_compile`` and
``apply_fsdp``: FSDP then shards the wrapped layer as one group, and compile compiles the wrapper's call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper, checkpoint_wrapper
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from xtrain.errors import ConfigError
from xtrain.model.moe import MoEBlock
from xtrain.model.transformer import Transformer
from xtrain.parallel.all_to_all import ExchangeTape, recording, replaying

POLICY_FORMS = "none | full | every:K | ratio:F"

# Operators whose outputs a recompute replays instead of running again (see the module docstring).
_SAVED_IN_FORWARD = frozenset({torch.ops.aten.topk.default})


def apply_activation_checkpointing(model: Transformer, policy: str = "full") -> list[int]:
    """Wrap the decoder layers that ``policy`` selects in non-reentrant checkpoint wrappers, in place; returns
    their indices. The wrapper forwards attribute access to the layer, and its state-dict keys are the layer's
    own, so checkpoints and ``layer.moe`` read as before."""
    selected = checkpointed_layers(policy, len(model.layers))
    for index in selected:
        model.layers[index] = checkpoint_wrapper(model.layers[index], checkpoint_fn=checkpoint_layer)
    return selected


def checkpoint_layer(layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """Run ``layer`` under non-reentrant checkpointing that saves the routing, and under expert parallelism the
    exchanged rows (the wrappers' checkpoint_fn)."""
    context_fn = _routing_and_exchanges_saved if exchanges_tokens(layer) else _routing_saved_contexts
    return checkpoint(layer, *args, use_reentrant=False, context_fn=context_fn, preserve_rng_state=True, **kwargs)


def exchanges_tokens(layer: torch.nn.Module) -> bool:
    """Whether ``layer`` holds an MoE block whose routed experts run elsewhere (expert parallelism's schedule)."""
    return any(isinstance(module, MoEBlock) and module.expert_schedule is not None for module in layer.modules())


def checkpointed_wrappers(model: Transformer) -> list[tuple[int, CheckpointWrapper]]:
    """(index, wrapper) of every checkpointed decoder layer, bottom to top."""
    return [(index, layer) for index, layer in enumerate(model.layers) if isinstance(layer, CheckpointWrapper)]


def set_checkpoint_fn(wrapper: CheckpointWrapper, fn: Callable[..., Any]) -> None:
    """Replace how a wrapper runs its layer (activation offload runs the checkpoint inside its hooks)."""
    wrapper.checkpoint_fn = fn  # type: ignore[assignment]  # the wrapper calls fn(module, *args, **kwargs)


def checkpointed_layers(policy: str, num_layers: int) -> list[int]:
    """Indices of the layers ``policy`` checkpoints, out of ``num_layers`` (ConfigError for a malformed one)."""
    kind, _, value = policy.strip().partition(":")
    if kind in {"none", "full"} and not value:
        return [] if kind == "none" else list(range(num_layers))
    if kind == "every" and value.isdigit() and int(value) >= 1:
        return list(range(0, num_layers, int(value)))
    if kind == "ratio":
        try:
            ratio = float(value)
        except ValueError:
            ratio = -1.0
        if 0.0 <= ratio <= 1.0:
            return list(range(round(ratio * num_layers)))
    raise ConfigError(f"activation checkpointing policy {policy!r} is not one of {POLICY_FORMS}")


def _save_routing(_ctx: Any, op: Any, *_args: Any, **_kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVED_IN_FORWARD else CheckpointPolicy.PREFER_RECOMPUTE


_routing_saved_contexts = functools.partial(create_selective_checkpoint_contexts, _save_routing)


class _ForwardSaving(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves it untyped
    """The forward of a checkpointed layer under EP: keeps the outputs of the routing's top-k, in order, and
    records the layer's exchanges on its tape (see the module docstring)."""

    def __init__(self, saved: list[Any], tape: ExchangeTape) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch leaves it untyped
        self.saved = saved
        self.exchanges = recording(tape)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in _SAVED_IN_FORWARD:
            self.saved.append(tree_map_only(torch.Tensor, torch.Tensor.detach, out))
        return out

    def __enter__(self) -> Any:
        self.exchanges.__enter__()
        return super().__enter__()  # type: ignore[no-untyped-call]  # torch leaves it untyped

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)  # type: ignore[no-untyped-call]  # torch leaves it untyped
        self.exchanges.__exit__(*exc)


class _RecomputeReplaying(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves it untyped
    """The recompute of that layer: the top-k outputs and the exchanges come from the forward; every other
    operator runs again. Unlike SAC's recompute mode it does not require every other operator to repeat the
    forward's: the experts' own FSDP group, nested in the layer, gathers in forward and not in the recompute."""

    def __init__(self, saved: list[Any], tape: ExchangeTape) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch leaves it untyped
        self.saved = saved
        self.tape = tape
        self.exchanges = replaying(tape)
        self.position = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func not in _SAVED_IN_FORWARD:
            return func(*args, **(kwargs or {}))
        if self.position >= len(self.saved):
            raise RuntimeError("the recompute of a checkpointed layer routed more often than its forward")
        out = self.saved[self.position]
        self.position += 1
        return tree_map_only(torch.Tensor, torch.Tensor.detach, out)

    def __enter__(self) -> Any:
        self.position = self.tape.replayed = 0  # a second backward (retain_graph) replays from the start
        self.exchanges.__enter__()
        return super().__enter__()  # type: ignore[no-untyped-call]  # torch leaves it untyped

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)  # type: ignore[no-untyped-call]  # torch leaves it untyped
        self.exchanges.__exit__(*exc)


def _routing_and_exchanges_saved() -> tuple[_ForwardSaving, _RecomputeReplaying]:
    """One checkpointed layer call under EP: its top-k outputs and its exchanges, saved and replayed."""
    saved: list[Any] = []
    tape = ExchangeTape()
    return _ForwardSaving(saved, tape), _RecomputeReplaying(saved, tape)
