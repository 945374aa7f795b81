"""Activation checkpointing applied from outside, per decoder layer: recompute a layer's activations in backward
instead of keeping them.

Always the non-reentrant implementation (``CheckpointImpl.NO_REENTRANT``, i.e. ``use_reentrant=False``): the
reentrant one runs the layer inside an autograd Function that only tracks the tensors it returns directly, and a
decoder layer returns its router statistics inside a dataclass, so the load-balancing and z-losses built from
them would get no gradient, silently. Non-reentrant checkpointing gives exactly the gradients of the plain model.

Policies (a string, as the training config spells them):

- ``none``: no layer is checkpointed;
- ``full``: every layer;
- ``every:K``: layers 0, K, 2K, ... (every K-th layer, K ≥ 1);
- ``ratio:F``: round(F × layers) layers, spread evenly over the depth (0 ≤ F ≤ 1).

Apply it on the model built on the meta device, before ``apply_compile`` and ``apply_fsdp`` (torchtitan's
order): FSDP then shards the wrapped layer as one group, and compile compiles the wrapper's call.
"""

from __future__ import annotations

from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

from xtrain.errors import ConfigError
from xtrain.model.transformer import Transformer

POLICY_FORMS = "none | full | every:K | ratio:F"


def apply_activation_checkpointing(model: Transformer, policy: str = "full") -> list[int]:
    """Wrap the decoder layers that ``policy`` selects in non-reentrant checkpoint wrappers, in place; returns
    their indices. The wrapper forwards attribute access to the layer, and its state-dict keys are the layer's
    own, so checkpoints and ``layer.moe`` read as before."""
    selected = checkpointed_layers(policy, len(model.layers))
    for index in selected:
        model.layers[index] = checkpoint_wrapper(model.layers[index], checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    return selected


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
            count = round(ratio * num_layers)
            # Evenly spread: layer floor(i * L / n) for i < n (distinct since n ≤ L).
            return [i * num_layers // count for i in range(count)]
    raise ConfigError(f"activation checkpointing policy {policy!r} is not one of {POLICY_FORMS}")
