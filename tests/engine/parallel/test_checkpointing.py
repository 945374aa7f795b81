"""Activation checkpointing applied from outside, per decoder layer (parallel/checkpointing.py): the policies
select the layers they name, the selected layers really recompute in backward, and every parameter gets exactly
the gradient of the plain model, the router included (with reentrant checkpointing the load-balancing and
z-losses, computed from the router statistics a layer returns inside a dataclass, would get none); also under
FSDP2 on two ranks."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from xtrain.errors import ConfigError
from xtrain.model.moe.aux_loss import load_balancing_loss, router_z_loss
from xtrain.model.transformer import Transformer
from xtrain.parallel.checkpointing import apply_activation_checkpointing, checkpointed_layers
from xtrain.parallel.materialize import unwrapped_names

from .compare import check, on_two_ranks
from .tiny import SEED, inputs_of_rank, sigmoid_moe_config, training_loss, unsharded


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("none", []),
        ("full", [0, 1, 2, 3, 4, 5, 6, 7]),
        ("every:1", [0, 1, 2, 3, 4, 5, 6, 7]),
        ("every:3", [0, 3, 6]),
        ("ratio:0", []),
        ("ratio:0.5", [0, 1, 2, 3]),
        ("ratio:0.25", [0, 1]),
        ("ratio:0.3", [0, 1]),
        ("ratio:1", [0, 1, 2, 3, 4, 5, 6, 7]),
    ],
)
def test_policy_selects_layers(policy: str, expected: list[int]) -> None:
    assert checkpointed_layers(policy, 8) == expected


@pytest.mark.parametrize("policy", ["", "some", "every:0", "every:x", "ratio:1.5", "ratio:-0.1", "ratio:nan", "full:2"])
def test_malformed_policy_is_refused_naming_the_forms(policy: str) -> None:
    with pytest.raises(ConfigError, match=r"none \| full \| every:K \| ratio:F"):
        checkpointed_layers(policy, 8)


def _gradients(model: Transformer, loss_of: Any) -> dict[str, torch.Tensor | None]:
    model.zero_grad(set_to_none=True)
    loss_of(model).backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    return unwrapped_names(grads)


def _full_loss(model: Transformer) -> torch.Tensor:
    return training_loss(model, *inputs_of_rank(0, model.config.vocab_size))


def _router_losses_only(model: Transformer) -> torch.Tensor:
    _, stats = model.forward_with_head(*inputs_of_rank(0, model.config.vocab_size), head=lambda h, w: None)
    return load_balancing_loss(stats) + router_z_loss(stats)


def _attention_calls(model: Transformer) -> list[int]:
    calls = [0] * len(model.layers)
    for index, layer in enumerate(model.layers):
        attention = layer.get_submodule("attention")  # through the checkpoint wrapper
        attention.register_forward_hook(lambda *_, index=index: calls.__setitem__(index, calls[index] + 1))
    return calls


@pytest.mark.slow  # the first checkpointed call imports torch._dynamo (seconds)
@pytest.mark.parametrize("policy", ["full", "every:2"])
def test_checkpointed_gradients_equal_the_plain_model_for_every_parameter(policy: str) -> None:
    plain = unsharded(sigmoid_moe_config(), SEED)
    checkpointed = copy.deepcopy(plain)
    selected = apply_activation_checkpointing(checkpointed, policy)
    assert selected == checkpointed_layers(policy, 3) and selected
    calls = _attention_calls(checkpointed)
    for loss_of in (_full_loss, _router_losses_only):
        want, got = _gradients(plain, loss_of), _gradients(checkpointed, loss_of)
        assert got.keys() == want.keys()
        if loss_of is _full_loss:
            assert all(grad is not None for grad in want.values())  # the loss reaches every parameter
        for name, grad in got.items():
            expected = want[name]
            if expected is None:  # e.g. the output projection, for the router losses alone
                assert grad is None, name
                continue
            assert grad is not None, f"{name}: no gradient"
            torch.testing.assert_close(grad, expected, rtol=1e-6, atol=1e-7, msg=name)
        routers = [grad for name, grad in got.items() if name.endswith("router.weight")]
        assert len(routers) == 2 and all(g is not None and bool(g.abs().sum() > 0) for g in routers)
    # Checkpointed layers ran forward twice per backward (once more to recompute), the others once.
    assert calls == [4 if index in selected else 2 for index in range(3)]


@on_two_ranks
def test_checkpointed_fsdp_gradients_equal_the_mean_of_unsharded_gradients(two_ranks: list[dict[str, Any]]) -> None:
    got = check(two_ranks, "gradients checkpointed")[0]["grads"]
    model = unsharded(sigmoid_moe_config(), SEED)
    per_rank = []
    for rank in range(2):
        model.zero_grad(set_to_none=True)
        training_loss(model, *inputs_of_rank(rank, model.config.vocab_size)).backward()
        per_rank.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    assert got.keys() == {name for name, _ in model.named_parameters()}
    for name, grad in got.items():
        assert grad is not None, f"{name}: no gradient"
        # FSDP averages the ranks' gradients (the trainer scales the loss for its own normalisation).
        expected = (per_rank[0][name] + per_rank[1][name]) / 2
        torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6, msg=name)
        if name.endswith("router.weight"):
            assert float(grad.abs().sum()) > 0, name
