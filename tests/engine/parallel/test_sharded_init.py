"""Initialisation after sharding (parallel/materialize.py) gives exactly the weights of the unsharded model's
``init_weights(seed)``, on 2 and 4 ranks and on an HSDP 2×2 mesh, also with wrapped layers; and
``init_weights`` itself looks through layer wrappers (checkpoint_wrapper, torch.compile's OptimizedModule).

In-place init with a generator on DTensor parameters ignores the generator (the global RNG decides, and two
ranks drew identical shards): any path that initialised the shards in place would fail these equalities."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from xtrain.model.transformer import Transformer
from xtrain.parallel.checkpointing import apply_activation_checkpointing
from xtrain.parallel.materialize import init_weights_sharded

from .compare import check, on_four_ranks, on_two_ranks
from .tiny import SEED, full_state, sigmoid_moe_config, unsharded


def _reference() -> dict[str, torch.Tensor]:
    return full_state(unsharded(sigmoid_moe_config(), SEED, prepare=lambda model: None))


def _assert_same_state(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key, tensor in want.items():
        assert got[key].dtype == tensor.dtype, key
        assert torch.equal(got[key], tensor), f"{key} differs from the unsharded init_weights({SEED})"


def _assert_init_matches(results: list[dict[str, Any]], name: str) -> None:
    rank0 = check(results, name)[0]
    want = _reference()
    _assert_same_state(rank0["state"], want)
    _assert_same_state(rank0["wrapped state"], want)  # FSDP's class swap + checkpoint_wrapper around each layer
    for result in check(results, name):  # and Transformer.init_weights on the shards refuses, naming the way
        refusal = result["init_weights on shards"]
        assert "DTensor" in refusal and "init_weights_sharded" in refusal, refusal


@on_two_ranks
def test_init_after_sharding_on_two_ranks_equals_unsharded_init(two_ranks: list[dict[str, Any]]) -> None:
    _assert_init_matches(two_ranks, "init")


@on_four_ranks
@pytest.mark.parametrize("mesh", ["fsdp", "hsdp"])
def test_init_after_sharding_on_four_ranks_equals_unsharded_init(four_ranks: list[dict[str, Any]], mesh: str) -> None:
    _assert_init_matches(four_ranks, f"init {mesh}")


def _wrap_checkpoint(model: Transformer) -> None:
    apply_activation_checkpointing(model, "full")


def _wrap_compile(model: Transformer) -> None:
    # torch.compile(module) returns an OptimizedModule around it; nothing is compiled until it is called.
    for index, layer in enumerate(model.layers):
        model.layers[index] = torch.compile(layer)


def _wrap_both(model: Transformer) -> None:
    for index, layer in enumerate(model.layers):
        model.layers[index] = torch.compile(checkpoint_wrapper(layer))


@pytest.mark.slow  # torch.compile and checkpointing import torch._dynamo (seconds)
@pytest.mark.parametrize("wrap", [_wrap_checkpoint, _wrap_compile, _wrap_both], ids=["checkpoint", "compile", "both"])
@pytest.mark.parametrize("init", ["init_weights", "init_weights_sharded"])
def test_init_looks_through_wrapped_layers(wrap: Any, init: str) -> None:
    with torch.device("meta"):
        model = Transformer(sigmoid_moe_config())
    wrap(model)
    assert not any(type(layer).__name__ == "DecoderLayer" for layer in model.layers)
    model.to_empty(device="cpu")
    if init == "init_weights":
        model.init_weights(SEED)
    else:
        init_weights_sharded(model, SEED)  # a plain (unsharded) model: the copy-out path of materialize
    state = {_unwrapped(key): tensor for key, tensor in model.state_dict().items()}
    _assert_same_state(state, _reference())


def _unwrapped(key: str) -> str:
    return key.replace("_orig_mod.", "").replace("_checkpoint_wrapped_module.", "")


def test_reference_init_is_seeded_and_covers_every_tensor() -> None:
    """What the equalities above lean on: init_weights(seed) is a function of the seed and writes everything."""
    first, again = _reference(), _reference()
    _assert_same_state(again, first)
    other = full_state(unsharded(sigmoid_moe_config(), SEED + 1, prepare=lambda model: None))
    assert not torch.equal(other["layers.1.moe.experts.gate_up_proj"], first["layers.1.moe.experts.gate_up_proj"])
    with torch.device("meta"):
        model = Transformer(sigmoid_moe_config())
    model.to_empty(device="cpu")
    for tensor in model.state_dict().values():
        tensor.fill_(float("nan"))
    model.init_weights(SEED)
    assert all(not t.isnan().any() for t in model.state_dict().values())
