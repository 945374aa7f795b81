"""Named sizes, parameter counts (against models built on the meta device and the published totals), FLOPs
(against a hand-derived case and torch's own FLOP counter), and `xtrain info`."""

import json

import pytest
import torch
from click.testing import CliRunner
from torch.utils.flop_counter import FlopCounterMode
from xtrain.cli import main
from xtrain.errors import ConfigError
from xtrain.model.config import ModelConfig
from xtrain.model.flops import (
    attention_training_flops,
    causal_attention_pairs,
    matmul_training_flops_per_token,
    training_flops,
    training_flops_per_token,
)
from xtrain.model.moe import MoEConfig
from xtrain.model.sizes import MODEL_SIZES, count_parameters, model_config
from xtrain.model.transformer import Transformer


@pytest.mark.parametrize("size", sorted(MODEL_SIZES))
def test_counts_equal_the_parameters_of_the_built_model(size: str) -> None:
    config = model_config(size)
    with torch.device("meta"):  # no memory, even for 235B
        model = Transformer(config)
    counts = count_parameters(config)
    assert counts.total == sum(p.numel() for p in model.parameters())
    # Every parameter of the routed experts (GPT-OSS's expert biases included).
    routed_per_layer = sum(
        sum(p.numel() for p in layer.moe.experts.parameters()) for layer in model.layers if layer.moe is not None
    )
    assert config.moe is None or routed_per_layer > 0
    inactive_fraction = 0 if config.moe is None else 1 - config.moe.num_experts_per_tok / config.moe.num_experts
    assert counts.active == counts.total - round(routed_per_layer * inactive_fraction)


@pytest.mark.parametrize(
    ("size", "total_billions", "active_billions"),
    # Published: Qwen3-30B-A3B "30.5B total, 3.3B activated"; Qwen3-235B-A22B "235B total, 22B activated".
    [("qwen3-30b-a3b", 30.5, 3.3), ("qwen3-235b-a22b", 235.0, 22.0)],
)
def test_real_shapes_match_the_published_sizes(size: str, total_billions: float, active_billions: float) -> None:
    counts = count_parameters(model_config(size))
    assert counts.total / 1e9 == pytest.approx(total_billions, rel=0.01)
    assert counts.active / 1e9 == pytest.approx(active_billions, rel=0.03)


def test_debug_size_is_tiny_and_mixes_dense_and_moe_layers() -> None:
    config = model_config("debug")
    assert config.moe is not None and config.moe.num_experts == 8 and config.moe.num_experts_per_tok == 2
    assert config.moe_layer_indices == [1, 2, 3]
    assert count_parameters(config).total < 2_000_000


def test_unknown_size_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown model size 'huge'; choose one of debug"):
        model_config("huge")


def _hand_config(moe: MoEConfig | None = None) -> ModelConfig:
    return ModelConfig(
        vocab_size=10,
        hidden_size=4,
        num_layers=1,
        num_attention_heads=2,
        num_kv_heads=1,
        head_dim=2,
        intermediate_size=3,
        tie_word_embeddings=True,
        moe=moe,
    )


def test_flops_of_a_hand_derived_dense_case() -> None:
    config = _hand_config()
    # Matmul weights per token: output projection 10*4 (tied, still a matmul), q 4*4, k 4*2, v 4*2, o 4*4,
    # MLP 3*4*3: 40 + 48 + 36 = 124.
    assert count_parameters(config).active_matmul == 124
    assert matmul_training_flops_per_token(config) == 6 * 124
    # Documents of 3 and 2 tokens keep 3*4/2 + 2*3/2 = 9 causal pairs; each costs 12 * layers * heads * d = 48.
    assert causal_attention_pairs([3, 2]) == 9
    assert attention_training_flops(config, [3, 2]) == 9 * 48
    assert training_flops(config, [3, 2]) == 5 * 744 + 432
    assert training_flops_per_token(config, [3, 2]) == pytest.approx((5 * 744 + 432) / 5)
    # One document of 5 tokens costs more attention than the same tokens split in two.
    assert training_flops(config, [5]) == 5 * 744 + 15 * 48


def test_flops_of_a_hand_derived_moe_case() -> None:
    config = _hand_config(MoEConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=3))
    # The MLP becomes: router 4*4 + two active experts of 3*4*3: 16 + 72 = 88; total 40 + 48 + 88.
    assert count_parameters(config).active_matmul == 176
    # Inactive: two of the four experts.
    assert count_parameters(config).total - count_parameters(config).active == 2 * 36


@pytest.mark.parametrize("size", ["debug", "debug-dense"])
def test_matmul_flops_equal_torch_flop_counter(size: str) -> None:
    """torch's FlopCounterMode counts every matmul of a real forward+backward (it has no formula for the CPU
    attention kernel, so it sees exactly the 6·N·T part)."""
    config = model_config(size)
    if config.moe is not None:  # per-expert matmuls, which the counter knows, instead of grouped_mm
        config = config.model_copy(update={"moe": config.moe.model_copy(update={"experts_impl": "loop"})})
    torch.manual_seed(0)
    model = Transformer(config)
    model.init_weights()
    lengths = [5, 9, 3]
    ids_1T = torch.randint(0, config.vocab_size, (1, sum(lengths)))
    cu = torch.tensor([0, 5, 14, 17], dtype=torch.int32)
    with FlopCounterMode(display=False) as counter:
        model(ids_1T, cu).square().mean().backward()
    assert counter.get_total_flops() == matmul_training_flops_per_token(config) * sum(lengths)


def test_negative_lengths_and_empty_batches_are_refused() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        causal_attention_pairs([3, -1])
    with pytest.raises(ValueError, match="without tokens"):
        training_flops_per_token(_hand_config(), [])


def test_xtrain_info_prints_counts_and_flops() -> None:
    result = CliRunner().invoke(main, ["info", "--model", "qwen3-30b-a3b", "--seq-len", "2048", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    config = model_config("qwen3-30b-a3b")
    counts = count_parameters(config)
    assert figures["parameters_total"] == counts.total
    assert figures["parameters_active"] == counts.active
    assert figures["training_flops_per_token"] == pytest.approx(training_flops_per_token(config, [2048]))
    text = CliRunner().invoke(main, ["info", "--model", "debug"])
    assert text.exit_code == 0 and "parameters active" in text.output and "FLOPs/token" in text.output


def test_xtrain_info_unknown_model_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["info", "--model", "huge"])
    assert result.exit_code == 2
    assert "unknown model size 'huge'" in result.output
    assert "Traceback" not in result.output
