"""The model API later work builds on: meta-device build, deterministic init, forward_hidden for a chunked
loss, the reported attention backend, input checks, and model files free of parallelism."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from xtrain.errors import AttentionBackendError
from xtrain.model.config import ModelConfig
from xtrain.model.documents import PackedDocuments
from xtrain.model.moe import MoEConfig
from xtrain.model.sizes import model_config
from xtrain.model.transformer import Transformer

MODEL_DIR = Path(__file__).resolve().parents[2] / "packages/engine/src/xtrain/model"


def _materialised(config: ModelConfig, seed: int) -> Transformer:
    with torch.device("meta"):
        model = Transformer(config)
    assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    return model


@pytest.mark.parametrize("size", ["debug", "debug-dense"])
def test_meta_build_then_init_is_deterministic_and_complete(size: str) -> None:
    config = model_config(size)
    first, again, other = _materialised(config, 0), _materialised(config, 0), _materialised(config, 1)
    for (name, p), q, r in zip(first.named_parameters(), again.parameters(), other.parameters(), strict=True):
        assert torch.isfinite(p).all(), name
        assert torch.equal(p, q), f"{name} differs between two inits with the same seed"
        if name.endswith("norm.weight"):
            assert torch.equal(p, torch.ones_like(p)), name
        else:
            assert not torch.equal(p, r), f"{name} ignores the generator"
            assert 0.01 < p.std().item() < 0.03, f"{name} has std {p.std().item():.3g}, expected about 0.02"


def _deepseek_style() -> ModelConfig:
    moe = MoEConfig(
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        router="sigmoid_group_limited",
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
        num_shared_experts=1,
    )
    return model_config("debug").model_copy(update={"moe": moe})


@pytest.mark.parametrize("config", [model_config("debug"), _deepseek_style()], ids=["qwen3-moe", "deepseek-style"])
def test_init_weights_writes_every_parameter_and_buffer(config: ModelConfig) -> None:
    model = _materialised(config, 0)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.fill_(float("nan"))
    model.init_weights()
    assert all(torch.isfinite(t).all() for t in [*model.parameters(), *model.buffers()])


def test_a_deepseek_style_moe_model_trains_on_a_packed_row() -> None:
    config = _deepseek_style()
    model = _materialised(config, 0)
    ids_1T = torch.randint(0, config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(3))
    out = model.forward_hidden(ids_1T, torch.tensor([0, 5, 12], dtype=torch.int32))
    logits_1TV = F.linear(out.hidden, model.output_projection_weight)
    F.cross_entropy(logits_1TV[0, :-1], ids_1T[0, 1:]).backward()
    assert len(out.router_stats) == 3
    missing = [name for name, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"no finite gradient for {missing}"


@pytest.mark.parametrize("size", ["debug", "debug-dense"])
def test_forward_hidden_and_output_projection_give_the_logits(size: str) -> None:
    config = model_config(size)
    model = _materialised(config, 0)
    ids_1T = torch.randint(0, config.vocab_size, (1, 13), generator=torch.Generator().manual_seed(0))
    cu = torch.tensor([0, 4, 13], dtype=torch.int32)
    out = model.forward_hidden(ids_1T, cu)
    assert out.hidden.shape == (1, 13, config.hidden_size)
    assert len(out.router_stats) == len(config.moe_layer_indices)
    assert all(stats.num_tokens == 13 for stats in out.router_stats)
    logits_1TV = model(ids_1T, cu)
    assert logits_1TV.shape == (1, 13, config.vocab_size)
    torch.testing.assert_close(logits_1TV, F.linear(out.hidden, model.output_projection_weight))
    if config.tie_word_embeddings:
        assert model.lm_head is None and model.output_projection_weight is model.embed_tokens.weight
    else:
        assert model.lm_head is not None and model.output_projection_weight is model.lm_head.weight


def test_documents_in_a_row_do_not_influence_each_other() -> None:
    config = model_config("debug")
    model = _materialised(config, 0)
    generator = torch.Generator().manual_seed(1)
    first, second = (
        torch.randint(0, 512, (1, 6), generator=generator),
        torch.randint(0, 512, (1, 9), generator=generator),
    )
    packed = model(torch.cat([first, second], dim=1), torch.tensor([0, 6, 15], dtype=torch.int32))
    torch.testing.assert_close(packed[:, :6], model(first), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[:, 6:], model(second), atol=1e-5, rtol=1e-5)
    # Without the boundary the second document sees the first: the boundary is what keeps them apart.
    assert not torch.allclose(model(torch.cat([first, second], dim=1))[:, 6:], packed[:, 6:], atol=1e-3)


def test_documents_can_be_given_prebuilt() -> None:
    model = _materialised(model_config("debug"), 0)
    ids_1T = torch.randint(0, 512, (1, 10), generator=torch.Generator().manual_seed(2))
    docs = PackedDocuments.from_lengths([4, 6], torch.device("cpu"))
    torch.testing.assert_close(
        model(ids_1T, documents=docs), model(ids_1T, torch.tensor([0, 4, 10], dtype=torch.int32)), atol=0, rtol=0
    )
    with pytest.raises(ValueError, match="documents must cover the row's 10 tokens"):
        model(ids_1T, documents=PackedDocuments.from_lengths([4], torch.device("cpu")))


def test_attention_backend_is_reported_and_an_impossible_one_refused() -> None:
    model = _materialised(model_config("debug-dense"), 0)
    assert model.attention_backend == "sdpa"
    forced = _materialised(model_config("debug-dense").model_copy(update={"attention_backend": "flash_attn"}), 0)
    with pytest.raises(AttentionBackendError, match="'flash_attn' was requested but cannot run"):
        _ = forced.attention_backend
    with pytest.raises(AttentionBackendError, match="needs a CUDA device"):
        forced(torch.zeros(1, 4, dtype=torch.long))


def test_input_must_be_one_packed_row() -> None:
    model = _materialised(model_config("debug-dense"), 0)
    with pytest.raises(ValueError, match=r"one packed row of shape \[1, T\], got \(2, 4\)"):
        model(torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="end at the row length 4"):
        model(torch.zeros(1, 4, dtype=torch.long), torch.tensor([0, 3], dtype=torch.int32))


def test_model_files_contain_no_parallelism_code() -> None:
    offenders = []
    for path in MODEL_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                names = [f"{node.value.id}.{node.attr}"]
            offenders += [f"{path.name}: {n}" for n in names if n.startswith("torch.distributed")]
    assert not offenders


def test_import_xtrain_does_not_import_torch_but_exports_load_hf_lazily() -> None:
    code = (
        "import sys, xtrain; assert 'torch' not in sys.modules, 'import xtrain pulled in torch'; "
        "f = xtrain.load_hf; assert callable(f) and callable(xtrain.save_hf); assert 'torch' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_unknown_attribute_of_xtrain_raises_attribute_error() -> None:
    import xtrain

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = xtrain.nope
