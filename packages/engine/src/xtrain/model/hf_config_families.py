"""config.json of DeepSeek-V3 (and Kimi K2) and GPT-OSS checkpoints, both directions.

``*_fields(hf)`` give the :class:`~xtrain.model.config.ModelConfig` fields of a config.json; ``*_to_hf(config)`` the
config.json transformers reads back into the same model. Features the model does not compute are refused by name
(another activation, attention dropout, a RoPE scaling other than YaRN, an MoE variant the block lacks).
"""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from xtrain.errors import ConfigError
from xtrain.model.mla import MLAConfig
from xtrain.model.moe import MoEConfig
from xtrain.model.rope import YarnScaling

if TYPE_CHECKING:
    from xtrain.model.config import ModelConfig


def rope_from_hf(hf: Mapping[str, Any]) -> tuple[float, YarnScaling | None]:
    """(rope_theta, YaRN scaling or None) from ``rope_parameters`` (transformers 5) or ``rope_scaling`` (Hub)."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "yarn":
        raise ConfigError(f"rope scaling {rope_type!r} is not implemented (plain RoPE and 'yarn' are)")
    original = params.get("original_max_position_embeddings")
    if original is None:
        raise ConfigError("the yarn rope scaling lacks original_max_position_embeddings")
    # transformers derives a missing factor from the two context lengths.
    factor = params.get("factor") or hf["max_position_embeddings"] / original
    return theta, YarnScaling(
        factor=factor,
        original_max_position_embeddings=original,
        beta_fast=params.get("beta_fast") or 32.0,
        beta_slow=params.get("beta_slow") or 1.0,
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        attention_factor=params.get("attention_factor"),
        truncate=params.get("truncate", True),
    )


def rope_to_hf(theta: float, scaling: YarnScaling | None) -> dict[str, Any]:
    if scaling is None:
        return {"rope_type": "default", "rope_theta": theta}
    params = {"rope_type": "yarn", "rope_theta": theta, **scaling.model_dump()}
    return {key: value for key, value in params.items() if value is not None}


def _refuse(hf: Mapping[str, Any]) -> None:
    problems = []
    if hf.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={hf['hidden_act']!r} (only 'silu' is implemented)")
    if float(hf.get("attention_dropout", 0.0) or 0.0) != 0.0:
        problems.append("attention_dropout > 0 (attention dropout is not implemented)")
    if problems:
        raise ConfigError("config.json asks for features xtrain does not implement: " + "; ".join(problems))


def _eos(hf: Mapping[str, Any]) -> int | tuple[int, ...] | None:
    eos = hf.get("eos_token_id")
    return tuple(eos) if isinstance(eos, list) else eos


def deepseek_v3_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
    """ModelConfig fields of a DeepseekV3ForCausalLM config.json (DeepSeek-V3, Kimi K2)."""
    _refuse(hf)
    try:
        theta, scaling = rope_from_hf(hf)
        heads = int(hf["num_attention_heads"])
        mla = MLAConfig(
            q_lora_rank=hf.get("q_lora_rank"),
            kv_lora_rank=hf["kv_lora_rank"],
            qk_nope_head_dim=hf["qk_nope_head_dim"],
            qk_rope_head_dim=hf["qk_rope_head_dim"],
            v_head_dim=hf["v_head_dim"],
            rope_interleave=hf.get("rope_interleave", True),
        )
        moe = MoEConfig.from_hf_config(dict(hf)).model_copy(update={"init_std": hf.get("initializer_range", 0.02)})
        first_dense = int(hf.get("first_k_dense_replace") or 0)
        num_layers = int(hf["num_hidden_layers"])
        return {
            "family": "deepseek_v3",
            "vocab_size": hf["vocab_size"],
            "hidden_size": hf["hidden_size"],
            "num_layers": num_layers,
            "num_attention_heads": heads,
            "num_kv_heads": heads,  # MLA expands its latent to every head
            "head_dim": mla.qk_head_dim,
            "intermediate_size": hf["intermediate_size"],
            "rms_norm_eps": hf.get("rms_norm_eps", 1e-6),
            "rope_theta": theta,
            "rope_scaling": scaling,
            "max_position_embeddings": hf.get("max_position_embeddings", 4096),
            "tie_word_embeddings": hf.get("tie_word_embeddings", False),
            "attention_bias": hf.get("attention_bias", False),
            "initializer_range": hf.get("initializer_range", 0.02),
            "moe": moe,
            # transformers: layer i is MoE iff i >= first_k_dense_replace (moe_layer_freq is not read).
            "mlp_only_layers": tuple(range(min(first_dense, num_layers))),
            "mla": mla,
            "num_nextn_predict_layers": hf.get("num_nextn_predict_layers", hf.get("num_mtp_layers", 0)) or 0,
            "bos_token_id": hf.get("bos_token_id"),
            "eos_token_id": _eos(hf),
        }
    except KeyError as missing:
        raise ConfigError(f"config.json lacks the field {missing.args[0]!r} that DeepseekV3ForCausalLM needs") from None


def deepseek_v3_to_hf(config: "ModelConfig") -> dict[str, Any]:
    mla, moe = config.mla, config.moe
    assert mla is not None  # the family's validator guarantees it
    if moe is None or moe.router != "sigmoid_group_limited" or moe.num_shared_experts == 0:
        raise ConfigError(
            "a DeepseekV3ForCausalLM checkpoint has MoE layers with the sigmoid group-limited router and shared "
            "experts; this configuration has none, so it cannot be exported in that format"
        )
    first_dense = len(config.mlp_only_layers)
    if config.mlp_only_layers != tuple(range(first_dense)) or config.decoder_sparse_step != 1:
        raise ConfigError("DeepSeek-V3 checkpoints keep dense layers first only (first_k_dense_replace)")
    if moe.shared_intermediate_size != moe.moe_intermediate_size * moe.num_shared_experts:
        raise ConfigError("DeepSeek-V3 shared experts are num_shared_experts x moe_intermediate_size wide")
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "moe_intermediate_size": moe.moe_intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_attention_heads,
        "n_shared_experts": moe.num_shared_experts,
        "n_routed_experts": moe.num_experts,
        "num_experts_per_tok": moe.num_experts_per_tok,
        "n_group": moe.n_group,
        "topk_group": moe.topk_group,
        "routed_scaling_factor": moe.routed_scaling_factor,
        "norm_topk_prob": moe.norm_topk_prob,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "first_k_dense_replace": first_dense,
        "q_lora_rank": mla.q_lora_rank,
        "kv_lora_rank": mla.kv_lora_rank,
        "qk_nope_head_dim": mla.qk_nope_head_dim,
        "qk_rope_head_dim": mla.qk_rope_head_dim,
        "v_head_dim": mla.v_head_dim,
        "rope_interleave": mla.rope_interleave,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": rope_to_hf(config.rope_theta, config.rope_scaling),
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.attention_bias,
        "attention_dropout": 0.0,
        "initializer_range": config.initializer_range,
        "num_nextn_predict_layers": config.num_nextn_predict_layers,
        "aux_loss_alpha": moe.aux_loss_coef,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": list(config.eos_token_id) if isinstance(config.eos_token_id, tuple) else config.eos_token_id,
        "use_cache": True,
    }


def gpt_oss_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
    """ModelConfig fields of a GptOssForCausalLM config.json (bf16 weights; MXFP4 is refused before this)."""
    _refuse(hf)
    try:
        theta, scaling = rope_from_hf(hf)
        num_layers = int(hf["num_hidden_layers"])
        layer_types = tuple(hf.get("layer_types") or ["full_attention"] * num_layers)
        experts = hf.get("num_local_experts", hf.get("num_experts"))
        if experts is None:
            raise KeyError("num_local_experts")
        moe = MoEConfig(
            num_experts=experts,
            num_experts_per_tok=hf["num_experts_per_tok"],
            moe_intermediate_size=hf["intermediate_size"],
            # The softmax over the k selected already sums to one: no renormalisation flag applies.
            norm_topk_prob=False,
            router="topk_softmax",
            router_bias=True,
            expert_bias=True,
            expert_activation="clamped_swiglu",
            swiglu_alpha=hf.get("swiglu_alpha", 1.702),
            swiglu_limit=hf.get("swiglu_limit", 7.0),
            aux_loss_coef=hf.get("router_aux_loss_coef", 0.0) or 0.0,
            init_std=hf.get("initializer_range", 0.02),
        )
        heads = int(hf["num_attention_heads"])
        return {
            "family": "gpt_oss",
            "vocab_size": hf["vocab_size"],
            "hidden_size": hf["hidden_size"],
            "num_layers": num_layers,
            "num_attention_heads": heads,
            "num_kv_heads": hf.get("num_key_value_heads", heads),
            "head_dim": hf.get("head_dim") or int(hf["hidden_size"]) // heads,
            # Every layer is an MoE layer; the dense width is unused (kept equal to the expert width).
            "intermediate_size": hf["intermediate_size"],
            "rms_norm_eps": hf.get("rms_norm_eps", 1e-5),
            "rope_theta": theta,
            "rope_scaling": scaling,
            "max_position_embeddings": hf.get("max_position_embeddings", 131072),
            "tie_word_embeddings": hf.get("tie_word_embeddings", False),
            "attention_bias": hf.get("attention_bias", True),
            "initializer_range": hf.get("initializer_range", 0.02),
            "moe": moe,
            "layer_types": layer_types,
            "sliding_window": hf.get("sliding_window") if "sliding_attention" in layer_types else None,
            "attention_sinks": True,
            "bos_token_id": hf.get("bos_token_id"),
            "eos_token_id": _eos(hf),
        }
    except KeyError as missing:
        raise ConfigError(f"config.json lacks the field {missing.args[0]!r} that GptOssForCausalLM needs") from None


def gpt_oss_to_hf(config: "ModelConfig") -> dict[str, Any]:
    moe = config.moe
    if moe is None or moe.router != "topk_softmax" or config.moe_layer_indices != list(range(config.num_layers)):
        raise ConfigError("a GptOssForCausalLM checkpoint has GPT-OSS MoE blocks in every layer; this one does not")
    if not config.attention_sinks or not config.attention_bias:
        raise ConfigError("GptOssForCausalLM always has attention sinks and attention biases")
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": moe.moe_intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "num_local_experts": moe.num_experts,
        "num_experts_per_tok": moe.num_experts_per_tok,
        "swiglu_alpha": moe.swiglu_alpha,
        "swiglu_limit": moe.swiglu_limit,
        "router_aux_loss_coef": moe.aux_loss_coef,
        "output_router_logits": False,
        "layer_types": list(config.layer_types or ["full_attention"] * config.num_layers),
        "sliding_window": config.sliding_window,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": rope_to_hf(config.rope_theta, config.rope_scaling),
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": True,
        "attention_dropout": 0.0,
        "initializer_range": config.initializer_range,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": list(config.eos_token_id) if isinstance(config.eos_token_id, tuple) else config.eos_token_id,
        "use_cache": True,
    }
