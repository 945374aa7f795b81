"""MoEConfig: validation and reading Hugging Face configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from xtrain.config import load_train_config
from xtrain.errors import ConfigError
from xtrain.model.moe import MoEConfig, UnsupportedHFMoEConfigError
from xtrain.train.build import resolve_model_config


def test_reads_transformers_qwen3_moe_config_and_hub_keys() -> None:
    from transformers import Qwen3MoeConfig

    hf = Qwen3MoeConfig(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32, norm_topk_prob=True)
    cfg = MoEConfig.from_hf_config(hf.to_dict())
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (16, 4, 32)
    assert cfg.norm_topk_prob and cfg.router == "softmax_topk"
    assert cfg.aux_loss_coef == pytest.approx(0.001)
    # Qwen3-30B-A3B's config.json on the Hub spells the expert count `num_experts`.
    hub = {
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "norm_topk_prob": True,
        "router_aux_loss_coef": 0.001,
        "hidden_act": "silu",
    }
    assert MoEConfig.from_hf_config(hub).num_experts == 128


def test_reads_deepseek_v3_config() -> None:
    hub = {
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048,
        "n_shared_experts": 1,
        "n_group": 8,
        "topk_group": 4,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "aux_loss_alpha": 0.001,
        "hidden_act": "silu",
    }
    cfg = MoEConfig.from_hf_config(hub)
    assert cfg.router == "sigmoid_group_limited"
    assert (cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor) == (8, 4, 2.5)
    assert cfg.shared_intermediate_size == 2048


def test_unsupported_variants_name_the_key() -> None:
    with pytest.raises(UnsupportedHFMoEConfigError, match="topk_method"):
        MoEConfig.from_hf_config(
            {
                "n_routed_experts": 8,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 4,
                "scoring_func": "softmax",
                "topk_method": "group_limited_greedy",
            }
        )
    with pytest.raises(UnsupportedHFMoEConfigError, match="shared_expert_intermediate_size"):
        MoEConfig.from_hf_config(
            {
                "num_experts": 8,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 4,
                "shared_expert_intermediate_size": 16,
            }
        )
    with pytest.raises(UnsupportedHFMoEConfigError, match="moe_intermediate_size"):
        MoEConfig.from_hf_config({"num_experts": 8, "num_experts_per_tok": 2})
    with pytest.raises(UnsupportedHFMoEConfigError, match="n_routed_experts"):
        MoEConfig.from_hf_config({"hidden_size": 8})
    assert issubclass(UnsupportedHFMoEConfigError, ValueError)


def test_validation_rejects_unknown_fields_and_impossible_shapes() -> None:
    with pytest.raises(ValidationError, match="extra"):
        MoEConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8, typo=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="exceeds num_experts"):
        MoEConfig(num_experts=4, num_experts_per_tok=5, moe_intermediate_size=8)
    with pytest.raises(ValidationError, match="divisible"):
        MoEConfig(
            num_experts=6,
            num_experts_per_tok=2,
            moe_intermediate_size=8,
            router="sigmoid_group_limited",
            n_group=4,
            topk_group=1,
        )
    with pytest.raises(ValidationError, match="raise topk_group"):
        MoEConfig(
            num_experts=8,
            num_experts_per_tok=4,
            moe_intermediate_size=8,
            router="sigmoid_group_limited",
            n_group=4,
            topk_group=1,
        )


def test_the_run_config_key_forces_the_experts_path() -> None:
    """``[model] experts_impl`` reaches every MoE block's config; an unknown name is one ConfigError naming the key
    and the choices."""
    example = Path(__file__).parents[3] / "examples" / "debug_moe.toml"
    default = resolve_model_config(load_train_config(example))
    assert default.moe is not None and default.moe.experts_impl == "auto"
    for impl in ("cpu_fused", "grouped_mm", "loop"):
        forced = resolve_model_config(load_train_config(example, [f"model.experts_impl={impl}"]))
        assert forced.moe is not None and forced.moe.experts_impl == impl
    with pytest.raises(ConfigError) as info:
        load_train_config(example, ["model.experts_impl=fused"])
    message = str(info.value)
    assert "model.experts_impl" in message and "'cpu_fused'" in message and message.count("\n") == 0
