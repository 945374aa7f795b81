"""Activation offload (parallel/offload.py) and the routing the checkpoint saves (parallel/checkpointing.py), on
CPU where the same mechanism runs with synchronous copies into its own buffer pool: gradients bit-identical with
and without offload, checkpoints leaving in forward order and coming back one layer ahead in reverse order, never
more than the configured number of layers resident, and a recompute that keeps the forward's routing even when
the router's input changes in between."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from xtrain.errors import ConfigError
from xtrain.model.transformer import Transformer
from xtrain.parallel.checkpointing import apply_activation_checkpointing
from xtrain.parallel.compile import apply_compile
from xtrain.parallel.materialize import unwrapped_names
from xtrain.parallel.offload import ActivationOffloader, apply_activation_offload

from .tiny import SEED, inputs_of_rank, sigmoid_moe_config, training_loss, unsharded

CPU = torch.device("cpu")


def _model(num_layers: int = 5) -> Transformer:
    return unsharded(sigmoid_moe_config().model_copy(update={"num_layers": num_layers}), SEED)


def _accumulated_gradients(model: Transformer, micro_batches: int = 2) -> dict[str, torch.Tensor]:
    """Gradients of two micro-batches accumulated, as the trainer does (a forward and backward each)."""
    model.zero_grad(set_to_none=True)
    for rank in range(micro_batches):
        training_loss(model, *inputs_of_rank(rank, model.config.vocab_size)).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return unwrapped_names(grads)


@pytest.mark.slow  # the first checkpointed call imports torch._dynamo (seconds)
@pytest.mark.parametrize("policy", ["every:2"])  # checkpointed and plain layers in turn ("full": the trainer test)
def test_gradients_are_bit_identical_with_and_without_offload(policy: str) -> None:
    plain = _model()
    checkpointed = copy.deepcopy(plain)
    apply_activation_checkpointing(checkpointed, policy)
    offloaded = copy.deepcopy(checkpointed)
    offloader = apply_activation_offload(offloaded, CPU)
    want, got = _accumulated_gradients(checkpointed), _accumulated_gradients(offloaded)
    assert got.keys() == want.keys() == {name for name, _ in plain.named_parameters()}
    for name, grad in got.items():
        assert torch.equal(grad, want[name]), name  # the same bits: offload copies values, it computes nothing
    assert offloader.offloaded_bytes > 0  # the checkpoints really went through the host buffers
    reference = _accumulated_gradients(plain)
    for name, grad in got.items():  # and checkpointing itself changed nothing but rounding order
        torch.testing.assert_close(grad, reference[name], rtol=1e-6, atol=1e-7, msg=name)


def _expected_log(layers: list[int], ahead: int) -> list[tuple[str, int]]:
    """Forward offloads every layer but the top one; backward restores top-down, each layer's checkpoint having
    been fetched ``ahead`` layers before it is needed."""
    log: list[tuple[str, int]] = [("offload", layer) for layer in layers[:-1]] + [("keep", layers[-1])]
    down = list(reversed(layers))
    fetched = 1  # the top one is on the device already
    for position, layer in enumerate(down):
        log.append(("restore", layer))
        while fetched < len(down) and fetched <= position + ahead:
            log.append(("prefetch", down[fetched]))
            fetched += 1
    return log


@pytest.mark.slow
@pytest.mark.parametrize(("policy", "resident"), [("full", 3), ("every:2", 2)])
def test_checkpoints_leave_in_forward_order_and_return_ahead_within_the_residency_bound(
    policy: str, resident: int
) -> None:
    model = _model(6)
    layers = apply_activation_checkpointing(model, policy)
    offloader = apply_activation_offload(model, CPU, resident_layers=resident)
    seen: list[int] = []
    original = offloader._note_residency

    def watch() -> None:  # the residency after every hook call, forward and backward
        original()
        seen.append(offloader.resident_layers_now())

    offloader._note_residency = watch  # type: ignore[method-assign]
    for rank in range(2):  # the second micro-batch's pass starts afresh, reusing the host buffers
        training_loss(model, *inputs_of_rank(rank, model.config.vocab_size)).backward()
        assert offloader.log == _expected_log(layers, ahead=resident - 1)
        assert offloader.resident_layers_now() == 0  # nothing held on the device after backward
        allocated = offloader.pool.allocated
    assert allocated == len(layers) - 1  # one host buffer per offloaded layer, reused by the second pass
    assert max(seen) == offloader.peak_resident_layers <= resident
    assert offloader.peak_resident_layers == min(resident, len(layers))  # the bound is also reached: prefetching


def test_offload_needs_checkpointed_layers_and_room_for_one_ahead() -> None:
    with pytest.raises(ConfigError, match=r"memory\.offload needs checkpointed layers"):
        apply_activation_offload(_model(), CPU)
    with pytest.raises(ConfigError, match="at least 2"):
        ActivationOffloader([0, 1], CPU, resident_layers=1)


def _routings_with_a_changed_recompute(model: Transformer) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Expert choices of every MoE layer in forward and in its recompute, where the router's input is changed
    in the recompute (standing for a kernel that rounds differently the second time)."""
    forward: list[torch.Tensor] = []
    recompute: list[torch.Tensor] = []
    # Made outside the checkpointed region: forward adds zeros, the recompute noise (the same operator both times,
    # as the selective checkpoint requires of a recompute).
    shape = (inputs_of_rank(0, model.config.vocab_size)[0].shape[1], model.config.hidden_size)
    zeros, noise = torch.zeros(shape), 10 * torch.randn(shape, generator=torch.Generator().manual_seed(3))
    for layer in model.layers:
        moe = layer.get_submodule("moe") if hasattr(layer, "moe") and layer.moe is not None else None
        if moe is None:
            continue
        calls = [0]

        def perturb(_module: Any, args: tuple[torch.Tensor, ...], calls: list[int] = calls) -> Any:
            calls[0] += 1
            return (args[0] + (noise if calls[0] == 2 else zeros),)  # call 2: the recompute

        def record(_module: Any, _args: Any, routing: Any, calls: list[int] = calls) -> None:
            (forward if calls[0] == 1 else recompute).append(routing.experts.clone())

        moe.router.register_forward_pre_hook(perturb)
        moe.router.register_forward_hook(record)
    training_loss(model, *inputs_of_rank(0, model.config.vocab_size)).backward()
    return forward, recompute


@pytest.mark.slow
def test_the_recompute_keeps_the_forward_routing() -> None:
    model = _model(3)
    apply_activation_checkpointing(model, "full")
    forward, recompute = _routings_with_a_changed_recompute(model)
    assert len(forward) == len(recompute) == 2
    for before, after in zip(forward, reversed(recompute), strict=True):  # recomputed top-down
        assert torch.equal(before, after)

    # The same change under a checkpoint that does not save the routing does move tokens to other experts.
    control = _model(3)
    for index, layer in enumerate(control.layers):
        control.layers[index] = checkpoint_wrapper(layer)
    forward, recompute = _routings_with_a_changed_recompute(control)
    assert any(not torch.equal(b, a) for b, a in zip(forward, reversed(recompute), strict=True))


@pytest.mark.slow  # compiles two layer kinds (aot_eager: the graph capture without code generation)
def test_an_offloaded_layer_compiles_inside_its_checkpoint_with_the_same_gradients() -> None:
    plain = _model(3)
    compiled = copy.deepcopy(plain)
    apply_activation_checkpointing(compiled, "full")
    offloader = apply_activation_offload(compiled, CPU)
    apply_compile(compiled, backend="aot_eager")
    want, got = _accumulated_gradients(plain, 1), _accumulated_gradients(compiled, 1)
    for name, grad in got.items():
        torch.testing.assert_close(grad, want[name], rtol=1e-6, atol=1e-7, msg=name)
    assert offloader.log[:2] == [("offload", 0), ("offload", 1)]  # the offload ran around the compiled layers
