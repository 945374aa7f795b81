"""ModelConfig: typed and strict, read from and written to Hugging Face config.json dictionaries."""

import pytest
from pydantic import ValidationError
from xtrain.errors import ConfigError
from xtrain.model.config import ModelConfig
from xtrain.model.moe import MoEConfig
from xtrain.model.sizes import MODEL_SIZES, model_config

# Qwen/Qwen3-30B-A3B config.json as published on the Hub (written by transformers 4.51).
QWEN3_30B_A3B_CONFIG_JSON = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def test_the_published_qwen3_30b_a3b_config_reads_as_the_named_size() -> None:
    assert ModelConfig.from_hf_config(QWEN3_30B_A3B_CONFIG_JSON) == model_config("qwen3-30b-a3b")


@pytest.mark.parametrize("size", sorted(MODEL_SIZES))
def test_hf_config_round_trips_and_transformers_accepts_it(size: str) -> None:
    from transformers import AutoConfig

    config = model_config(size)
    hf = config.to_hf_config()
    assert ModelConfig.from_hf_config(hf) == config
    theirs = AutoConfig.for_model(hf["model_type"], **{k: v for k, v in hf.items() if k != "model_type"})
    # transformers' config class of each architecture xtrain writes (CausalLM -> Config).
    assert type(theirs).__name__ == config.hf_architecture.replace("ForCausalLM", "Config")
    # transformers' DeepseekV3Config calls the rotary width head_dim; for the other families it is the head width.
    assert theirs.num_hidden_layers == config.num_layers and theirs.head_dim == config.rotary_dim


def test_transformers_5_spelling_num_local_experts_is_read() -> None:
    hf = {**QWEN3_30B_A3B_CONFIG_JSON, "num_local_experts": 128}
    del hf["num_experts"]
    hf["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000.0}
    del hf["rope_theta"]
    assert ModelConfig.from_hf_config(hf) == model_config("qwen3-30b-a3b")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"use_sliding_window": True, "sliding_window": 4096}, "use_sliding_window=true"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, "rope scaling 'yarn'"),
        ({"attention_dropout": 0.1}, "attention_dropout"),
        ({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral"}, "'MixtralForCausalLM'.*not supported"),
    ],
)
def test_unsupported_hf_features_are_refused_by_name(change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_hf_config({**QWEN3_30B_A3B_CONFIG_JSON, **change})


def test_missing_hf_field_is_named() -> None:
    hf = dict(QWEN3_30B_A3B_CONFIG_JSON)
    del hf["intermediate_size"]
    with pytest.raises(ConfigError, match="lacks the field 'intermediate_size'"):
        ModelConfig.from_hf_config(hf)


def test_unknown_fields_and_bad_shapes_are_rejected() -> None:
    base = model_config("debug-dense").model_dump()
    with pytest.raises(ValidationError, match="extra_forbidden"):
        ModelConfig(**base, num_heads=4)
    with pytest.raises(ValidationError, match="must be a multiple of num_kv_heads"):
        ModelConfig(**{**base, "num_kv_heads": 3})
    with pytest.raises(ValidationError, match=r"mlp_only_layers \[7\] are outside"):
        ModelConfig(**{**base, "mlp_only_layers": (7,)})


def test_moe_layer_rule_follows_hf() -> None:
    moe = MoEConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8)
    config = model_config("debug-dense").model_copy(
        update={"moe": moe, "num_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": (3,)}
    )
    # (i + 1) % 2 == 0 -> layers 1, 3, 5; layer 3 is forced dense.
    assert config.moe_layer_indices == [1, 5]


def test_a_configuration_without_a_qwen3_moe_equivalent_cannot_be_exported() -> None:
    moe = MoEConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=8, num_shared_experts=1)
    config = model_config("debug").model_copy(update={"moe": moe})
    with pytest.raises(ConfigError, match="no Qwen3MoeForCausalLM equivalent"):
        config.to_hf_config()
