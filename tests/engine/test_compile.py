"""torch.compile of the decoder layers: one graph per layer (fullgraph=True), compiled once for every set of
document lengths of a row, with the outputs and gradients of eager mode.

Compiles are slow on a small CPU machine, so one test goes through inductor (code generation: the numerics of the
MoE layer, whose custom ops, hand-written autograd functions and in-place writes are what inductor could get
wrong) and the others through "aot_eager". Graph breaks, guards and recompilations are decided by dynamo before
any backend runs, and aot_eager traces the same joint forward/backward graph with fake tensors as inductor does,
so it checks all of those at a fraction of the cost; it then runs the captured aten ops eagerly, which makes its
results bit-identical to eager mode.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend
from xtrain.model.attention_backends import attention_function
from xtrain.model.config import ModelConfig
from xtrain.model.documents import PackedDocuments
from xtrain.model.layers import rotary_cos_sin
from xtrain.model.sizes import model_config
from xtrain.model.transformer import DecoderLayer, Transformer
from xtrain.parallel.compile import apply_compile

pytestmark = pytest.mark.slow

ROW = 48
# Same row length, new boundaries and new numbers of documents: none of them may compile anything new.
PACKS = ([ROW], [20, 28], [5, 17, 9, 17], [1, 1, 30, 16])


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    # Compiled code is cached per code object across tests: each test counts its own compilations.
    torch._dynamo.reset()


def _model(size: str) -> Transformer:
    model = Transformer(model_config(size))
    model.init_weights(seed=0)
    return model


def _layer_inputs(
    config: ModelConfig, lengths: Sequence[int], seed: int
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], PackedDocuments, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    docs = PackedDocuments.from_lengths(lengths, torch.device("cpu"))
    x_TD = torch.randn(ROW, config.hidden_size, generator=generator)
    probe_TD = torch.randn(ROW, config.hidden_size, generator=generator)
    return x_TD, rotary_cos_sin(docs.position_ids, config.head_dim, config.rope_theta, x_TD.dtype), docs, probe_TD


def _layer_step(layer: torch.nn.Module, config: ModelConfig, lengths: Sequence[int], seed: int) -> list[torch.Tensor]:
    """Output, input gradient and parameter gradients of one forward/backward of a decoder layer."""
    x_TD, rotary, docs, probe_TD = _layer_inputs(config, lengths, seed)
    x_TD.requires_grad_(True)
    layer.zero_grad(set_to_none=True)
    y_TD, stats = layer(x_TD, rotary, docs, attention_function("sdpa"))
    loss = (y_TD * probe_TD).sum()
    if stats is not None:
        loss = loss + stats.z_loss_sum * 1e-3  # the router's own gradient path, as the trainer uses it
    loss.backward()
    assert x_TD.grad is not None
    grads = [p.grad for p in layer.parameters()]
    assert all(g is not None for g in grads)
    return [y_TD.detach(), x_TD.grad, *(g for g in grads if g is not None)]


def _assert_all_close(compiled: list[torch.Tensor], eager: list[torch.Tensor], tol: float) -> None:
    assert len(compiled) == len(eager)
    for got, want in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def test_moe_layer_under_inductor_matches_eager_and_compiles_once() -> None:
    config = model_config("debug")
    layer = _model("debug").layers[1]
    assert isinstance(layer, DecoderLayer) and layer.moe is not None
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(layer, backend=counter, fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed, lengths in enumerate(PACKS):
            eager = _layer_step(layer, config, lengths, seed)
            # fp32: inductor reorders a few reductions, hence not bit-exact, but within rounding.
            _assert_all_close(_layer_step(compiled, config, lengths, seed), eager, tol=2e-5)
    assert counter.frame_count == 1


def test_dense_layer_compiles_once_for_all_document_lengths_and_matches_eager() -> None:
    config = model_config("debug-dense")
    layer = _model("debug-dense").layers[0]
    assert isinstance(layer, DecoderLayer) and layer.mlp is not None
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(layer, backend=counter, fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed, lengths in enumerate(PACKS):
            _assert_all_close(
                _layer_step(compiled, config, lengths, seed), _layer_step(layer, config, lengths, seed), 0
            )
    assert counter.frame_count == 1


def _head(hidden_TD: torch.Tensor, weight_VD: torch.Tensor) -> torch.Tensor:
    return F.linear(hidden_TD, weight_VD).logsumexp(dim=-1).mean()


def _whole_model_step(model: Transformer, lengths: Sequence[int]) -> list[torch.Tensor]:
    """Logits of forward, then loss and gradients through forward_with_head."""
    config = model.config
    ids_1T = torch.randint(0, config.vocab_size, (1, ROW), generator=torch.Generator().manual_seed(len(lengths)))
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    logits_1TV = model(ids_1T, cu_seqlens).detach()
    model.zero_grad(set_to_none=True)
    loss, router_stats = model.forward_with_head(ids_1T, cu_seqlens, head=_head)
    (loss + sum(stats.z_loss_sum for stats in router_stats) * 1e-3).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    return [logits_1TV, loss.detach(), *(g for g in grads if g is not None)]


def test_apply_compile_on_the_whole_model_compiles_one_graph_per_layer_kind() -> None:
    eager_model = _model("debug")
    compiled_model = _model("debug")
    counter = CompileCounterWithBackend("aot_eager")
    apply_compile(compiled_model, fullgraph=True, backend=counter)
    for lengths in PACKS:
        _assert_all_close(_whole_model_step(compiled_model, lengths), _whole_model_step(eager_model, lengths), 0)
    # Layer 0 is dense, layers 1-3 are MoE: two graphs serve all four layers and all packs.
    assert counter.frame_count == 2
