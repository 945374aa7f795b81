"""torch.compile (fullgraph) of one DeepSeek-V3 layer (MLA) and one GPT-OSS layer (sinks, sliding window): the
eager results, and new document lengths and counts of the same row length compile nothing new. Through
"aot_eager", which traces the joint forward/backward graph as inductor does (see tests/engine/test_compile.py)."""

from pathlib import Path

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from xtrain.model.attention_backends import attention_function
from xtrain.model.config import ModelConfig
from xtrain.model.documents import PackedDocuments
from xtrain.model.hf import read_hf_config
from xtrain.model.rope import rotary_tables
from xtrain.model.transformer import Transformer

from .hf_reference import build_deepseek_v3, build_gpt_oss

pytestmark = pytest.mark.slow

ROW = 24
PACKS = ([ROW], [10, 14], [3, 1, 12, 8])


def _step(layer: torch.nn.Module, config: ModelConfig, lengths: list[int]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(len(lengths))
    docs = PackedDocuments.from_lengths(lengths, torch.device("cpu"))
    x_TD = torch.randn(ROW, config.hidden_size, generator=generator, requires_grad=True)
    probe_TD = torch.randn(ROW, config.hidden_size, generator=generator)
    rotary = rotary_tables(docs.position_ids, config.rotary_dim, config.rope_theta, config.rope_scaling, x_TD.dtype)
    layer.zero_grad(set_to_none=True)
    y_TD, _ = layer(x_TD, rotary, docs, attention_function("sdpa"))
    (y_TD * probe_TD).sum().backward()
    assert x_TD.grad is not None
    return [y_TD.detach(), x_TD.grad, *(p.grad for p in layer.parameters() if p.grad is not None)]


@pytest.mark.parametrize("family", ["deepseek_v3", "gpt_oss"])
def test_layer_compiles_fullgraph_once_and_matches_eager(family: str, tmp_path: Path) -> None:
    torch._dynamo.reset()
    reference = build_deepseek_v3(0) if family == "deepseek_v3" else build_gpt_oss(0)
    reference.save_pretrained(tmp_path)
    config = read_hf_config(tmp_path)
    model = Transformer(config)
    model.init_weights(seed=0)
    layer = model.layers[1] if family == "deepseek_v3" else model.layers[0]  # an MoE layer; a sliding one
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(layer, fullgraph=True, backend=counter, dynamic=False)
    for lengths in PACKS:
        eager = _step(layer, config, list(lengths))
        got = _step(compiled, config, list(lengths))
        for a, b in zip(got, eager, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert counter.frame_count == 1
