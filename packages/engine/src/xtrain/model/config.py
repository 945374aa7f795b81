"""The typed configuration of the decoder, and its mapping from/to HF config.json.

Families: Qwen3 (dense and MoE), DeepSeek-V3 (multi-head latent attention, sigmoid group-limited MoE; Kimi K2 has
the same architecture) and GPT-OSS (sliding-window and full layers, attention sinks, biased experts). Unknown
fields are rejected (pydantic ``extra="forbid"``). :meth:`ModelConfig.from_hf_config` reads the ``config.json``
of a ``Qwen3ForCausalLM``, ``Qwen3MoeForCausalLM``, ``DeepseekV3ForCausalLM`` or ``GptOssForCausalLM`` checkpoint
and refuses, with a message, the features this model does not implement (quantised weights, other activations,
RoPE scalings other than YaRN, ...), so a checkpoint is never loaded into a model that would compute something
else. The DeepSeek-V3 and GPT-OSS translations live in :mod:`xtrain.model.hf_config_families`.
"""

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from xtrain.errors import ConfigError
from xtrain.model.attention_backends import AttentionBackendName
from xtrain.model.mla import MLAConfig
from xtrain.model.moe import MoEConfig
from xtrain.model.rope import YarnScaling, yarn_softmax_scale

HF_MOE_ARCHITECTURE = "Qwen3MoeForCausalLM"
HF_DENSE_ARCHITECTURE = "Qwen3ForCausalLM"
HF_DEEPSEEK_V3_ARCHITECTURE = "DeepseekV3ForCausalLM"
HF_GPT_OSS_ARCHITECTURE = "GptOssForCausalLM"
_HF_MODEL_TYPES = {
    HF_MOE_ARCHITECTURE: "qwen3_moe",
    HF_DENSE_ARCHITECTURE: "qwen3",
    HF_DEEPSEEK_V3_ARCHITECTURE: "deepseek_v3",
    HF_GPT_OSS_ARCHITECTURE: "gpt_oss",
}
# Kimi K2's config.json names its own model_type but the DeepSeek-V3 architecture.
_EXTRA_MODEL_TYPES = {"kimi_k2": HF_DEEPSEEK_V3_ARCHITECTURE}
ModelFamily = Literal["qwen3", "deepseek_v3", "gpt_oss"]
LayerType = Literal["full_attention", "sliding_attention"]


class ModelConfig(BaseModel):
    """Shape and numerics of the decoder. Field names follow the model, not Hugging Face's spelling."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(gt=0)
    """Number of token ids (rows of the embedding and of the output projection)."""
    hidden_size: int = Field(gt=0)
    """Width D of the residual stream."""
    num_layers: int = Field(gt=0)
    """Number of decoder layers."""
    num_attention_heads: int = Field(gt=0)
    """Query heads H per layer."""
    num_kv_heads: int = Field(gt=0)
    """Key/value heads K per layer (grouped-query attention: H must be a multiple of K)."""
    head_dim: int = Field(gt=0)
    """Width d of one head; Qwen3 sets it explicitly (128), so H*d need not equal D."""
    intermediate_size: int = Field(gt=0)
    """Hidden width of the dense SwiGLU MLP used by the non-MoE layers."""
    rms_norm_eps: float = Field(default=1e-6, gt=0)
    """Epsilon inside every RMSNorm (layer norms, final norm and the per-head q/k norms)."""
    rope_theta: float = Field(default=1_000_000.0, gt=0)
    """Base of the rotary position embedding frequencies."""
    max_position_embeddings: int = Field(default=40960, gt=0)
    """Longest document the checkpoint was trained for (recorded for export; positions are not capped)."""
    tie_word_embeddings: bool = False
    """Use the embedding matrix as the output projection (no separate lm_head)."""
    attention_bias: bool = False
    """Biases on the q/k/v/o projections (False for all released Qwen3 models)."""
    initializer_range: float = Field(default=0.02, gt=0)
    """Standard deviation of the normal initialisation of every weight matrix in ``init_weights``."""
    moe: MoEConfig | None = None
    """Mixture-of-experts settings; None makes every layer a dense MLP layer (Qwen3 dense)."""
    mlp_only_layers: tuple[int, ...] = ()
    """Layer indices that use the dense MLP even though ``moe`` is set (HF ``mlp_only_layers``)."""
    decoder_sparse_step: int = Field(default=1, gt=0)
    """Layer i is an MoE layer when (i + 1) is a multiple of this, and i is not in ``mlp_only_layers``."""
    attention_backend: AttentionBackendName = "auto"
    """Attention kernel: "auto" picks flash_attn, then torch_varlen, then sdpa, by what can run."""
    family: ModelFamily = "qwen3"
    """Architecture family: "qwen3" (per-head q/k RMSNorm), "deepseek_v3" (multi-head latent attention, needs
    ``mla``), "gpt_oss" (attention sinks, sliding-window layers, biased clamped-SwiGLU experts)."""
    mla: MLAConfig | None = None
    """Multi-head latent attention shapes (DeepSeek-V3 family only); ``head_dim`` is then its query-key width."""
    rope_scaling: YarnScaling | None = None
    """YaRN rotary scaling; None is plain RoPE."""
    layer_types: tuple[LayerType, ...] = ()
    """Per-layer attention kind (GPT-OSS ``layer_types``); empty means every layer attends fully."""
    sliding_window: int | None = Field(default=None, gt=0)
    """Keys a query of a "sliding_attention" layer sees, itself included (transformers' convention)."""
    attention_sinks: bool = False
    """One learned logit per head that joins every softmax and takes probability mass (GPT-OSS ``sinks``)."""
    num_nextn_predict_layers: int = Field(default=0, ge=0)
    """DeepSeek-V3's multi-token-prediction layers stored after the decoder; recorded, not built (their
    checkpoint tensors are skipped on load, as transformers does)."""
    bos_token_id: int | None = None
    """Carried through for export to config.json; the model itself does not use it."""
    eos_token_id: int | tuple[int, ...] | None = None
    """Carried through for export to config.json; the model itself does not use it."""

    @model_validator(mode="after")
    def _check_shapes(self) -> "ModelConfig":
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        bad = [i for i in self.mlp_only_layers if not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"mlp_only_layers {bad} are outside 0..{self.num_layers - 1}")
        if (self.family == "deepseek_v3") != (self.mla is not None):
            raise ValueError("family 'deepseek_v3' and mla go together: set both or neither")
        if self.mla is not None:
            if self.head_dim != self.mla.qk_head_dim or self.num_kv_heads != self.num_attention_heads:
                raise ValueError(
                    f"with mla, head_dim must be qk_nope_head_dim + qk_rope_head_dim ({self.mla.qk_head_dim}) and "
                    f"num_kv_heads must equal num_attention_heads ({self.num_attention_heads})"
                )
            if self.mla.qk_rope_head_dim % 2:
                raise ValueError(f"qk_rope_head_dim must be even, got {self.mla.qk_rope_head_dim}")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        if "sliding_attention" in self.layer_types and self.sliding_window is None:
            raise ValueError("layer_types has sliding_attention layers but sliding_window is not set")
        masked = self.attention_sinks or "sliding_attention" in self.layer_types
        if masked and self.attention_backend in ("flash_attn", "torch_varlen"):
            raise ValueError(
                f"attention_backend={self.attention_backend!r} cannot compute attention sinks or sliding windows "
                "here (they run on the per-document masked-softmax path): set attention_backend='auto' or 'sdpa'"
            )
        return self

    @property
    def qk_norm(self) -> bool:
        """Per-head RMSNorm of queries and keys (Qwen3 only)."""
        return self.family == "qwen3"

    @property
    def rotary_dim(self) -> int:
        """Width of the rotated part of a query-key head."""
        return self.mla.qk_rope_head_dim if self.mla is not None else self.head_dim

    @property
    def value_head_dim(self) -> int:
        return self.mla.v_head_dim if self.mla is not None else self.head_dim

    @property
    def softmax_scale(self) -> float:
        """Scale of the attention logits: head_dim^-0.5, with DeepSeek-V3's YaRN correction."""
        scale: float = self.head_dim**-0.5
        return scale * yarn_softmax_scale(self.rope_scaling) if self.family == "deepseek_v3" else scale

    def layer_window(self, layer_index: int) -> int | None:
        """The sliding window of layer ``layer_index``, or None when it attends to its whole document."""
        if self.layer_types and self.layer_types[layer_index] == "sliding_attention":
            return self.sliding_window
        return None

    @property
    def masked_attention(self) -> bool:
        """Whether attention needs the masked-softmax path (sinks or windows; see xtrain.model.document_masked)."""
        return self.attention_sinks or "sliding_attention" in self.layer_types

    def is_moe_layer(self, layer_index: int) -> bool:
        """Whether layer ``layer_index`` holds a mixture of experts (the same rule as HF Qwen3-MoE)."""
        return (
            self.moe is not None
            and layer_index not in self.mlp_only_layers
            and (layer_index + 1) % self.decoder_sparse_step == 0
        )

    @property
    def moe_layer_indices(self) -> list[int]:
        return [i for i in range(self.num_layers) if self.is_moe_layer(i)]

    @property
    def hf_architecture(self) -> str:
        if self.family == "deepseek_v3":
            return HF_DEEPSEEK_V3_ARCHITECTURE
        if self.family == "gpt_oss":
            return HF_GPT_OSS_ARCHITECTURE
        return HF_DENSE_ARCHITECTURE if self.moe is None else HF_MOE_ARCHITECTURE

    @classmethod
    def from_hf_config(cls, hf: Mapping[str, Any]) -> "ModelConfig":
        """Translate the content of a config.json of one of the supported architectures."""
        from xtrain.model import hf_config_families  # noqa: PLC0415 (it imports this module)

        architecture = hf_architecture_of(hf)
        reject_quantized(hf)
        if architecture == HF_DEEPSEEK_V3_ARCHITECTURE:
            return cls(**hf_config_families.deepseek_v3_fields(hf))
        if architecture == HF_GPT_OSS_ARCHITECTURE:
            return cls(**hf_config_families.gpt_oss_fields(hf))
        _reject_unsupported(hf)
        num_heads = int(hf["num_attention_heads"])
        kv_heads = hf.get("num_key_value_heads")
        head_dim = hf.get("head_dim") or int(hf["hidden_size"]) // num_heads
        moe = None
        if architecture == HF_MOE_ARCHITECTURE and _hf_num_experts(hf) > 0:
            # transformers 5 writes num_experts under its attribute name num_local_experts.
            moe = MoEConfig.from_hf_config({**hf, "num_experts": _hf_num_experts(hf)})
            moe = moe.model_copy(update={"init_std": hf.get("initializer_range", 0.02)})
        eos = hf.get("eos_token_id")
        try:
            return cls(
                vocab_size=hf["vocab_size"],
                hidden_size=hf["hidden_size"],
                num_layers=hf["num_hidden_layers"],
                num_attention_heads=num_heads,
                num_kv_heads=num_heads if kv_heads is None else kv_heads,
                head_dim=head_dim,
                intermediate_size=hf["intermediate_size"],
                rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
                rope_theta=_rope_theta(hf),
                max_position_embeddings=hf.get("max_position_embeddings", 40960),
                tie_word_embeddings=hf.get("tie_word_embeddings", False),
                attention_bias=hf.get("attention_bias", False),
                initializer_range=hf.get("initializer_range", 0.02),
                moe=moe,
                mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()) if moe is not None else (),
                decoder_sparse_step=hf.get("decoder_sparse_step", 1) if moe is not None else 1,
                bos_token_id=hf.get("bos_token_id"),
                eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
            )
        except KeyError as missing:
            raise ConfigError(f"config.json lacks the field {missing.args[0]!r} that {architecture} needs") from None

    def to_hf_config(self) -> dict[str, Any]:
        """The config.json content transformers reads back into an equivalent model."""
        from xtrain.model import hf_config_families  # noqa: PLC0415 (it imports this module)

        if self.family == "deepseek_v3":
            return hf_config_families.deepseek_v3_to_hf(self)
        if self.family == "gpt_oss":
            return hf_config_families.gpt_oss_to_hf(self)
        architecture = self.hf_architecture
        hf: dict[str, Any] = {
            "architectures": [architecture],
            "model_type": _HF_MODEL_TYPES[architecture],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            # Older readers (transformers 4.x) look for these two instead of rope_parameters.
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "use_sliding_window": False,
            "sliding_window": None,
            "initializer_range": self.initializer_range,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id,
            "use_cache": True,
        }
        if self.moe is not None:
            hf.update(moe_to_hf_fields(self.moe))
            hf["mlp_only_layers"] = list(self.mlp_only_layers)
            hf["decoder_sparse_step"] = self.decoder_sparse_step
        else:
            hf["max_window_layers"] = self.num_layers
        return hf


def hf_architecture_of(hf: Mapping[str, Any]) -> str:
    """The supported architecture named by config.json, or a ConfigError naming what it found."""
    architectures = hf.get("architectures") or []
    supported = sorted(_HF_MODEL_TYPES)
    for name in architectures:
        if name in _HF_MODEL_TYPES:
            return str(name)
    model_type = hf.get("model_type")
    if not architectures:
        for name, known_type in _HF_MODEL_TYPES.items():
            if model_type == known_type:
                return name
        if isinstance(model_type, str) and model_type in _EXTRA_MODEL_TYPES:
            return _EXTRA_MODEL_TYPES[model_type]
    raise ConfigError(
        f"architecture {architectures or model_type!r} is not supported; xtrain loads {', '.join(supported)}"
    )


def moe_to_hf_fields(moe: MoEConfig) -> dict[str, Any]:
    """The Qwen3-MoE config.json fields describing ``moe``; refuses what that format cannot express."""
    if moe.router != "softmax_topk" or moe.num_shared_experts:
        raise ConfigError(
            "this MoE configuration (sigmoid group-limited router or shared experts) has no Qwen3MoeForCausalLM "
            "equivalent, so it cannot be exported as a Hugging Face Qwen3-MoE checkpoint"
        )
    return {
        "num_experts": moe.num_experts,
        "num_experts_per_tok": moe.num_experts_per_tok,
        "moe_intermediate_size": moe.moe_intermediate_size,
        "norm_topk_prob": moe.norm_topk_prob,
        "router_aux_loss_coef": moe.aux_loss_coef,
        "output_router_logits": False,
    }


def _hf_num_experts(hf: Mapping[str, Any]) -> int:
    # Hub checkpoints say num_experts; transformers 5 writes its attribute name num_local_experts.
    return int(hf.get("num_experts", hf.get("num_local_experts", 0)) or 0)


def _rope_theta(hf: Mapping[str, Any]) -> float:
    params = hf.get("rope_parameters")
    if isinstance(params, Mapping) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(hf.get("rope_theta", 10000.0))


def reject_quantized(hf: Mapping[str, Any]) -> None:
    """Quantised checkpoints (GPT-OSS's MXFP4 experts, DeepSeek-V3's FP8 blocks) are refused by name."""
    quantization = hf.get("quantization_config")
    if quantization:
        method = quantization.get("quant_method", "?") if isinstance(quantization, Mapping) else quantization
        raise ConfigError(
            f"config.json declares quantization_config with quant_method={method!r}: xtrain loads unquantised "
            "weights (bf16, fp16 or fp32) only; use a dequantised checkpoint (for GPT-OSS the published *-BF16 "
            "conversions, for DeepSeek-V3 and Kimi K2 a bf16 conversion of the FP8 weights)"
        )


def _reject_unsupported(hf: Mapping[str, Any]) -> None:
    problems = []
    if hf.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={hf['hidden_act']!r} (only 'silu' is implemented)")
    if hf.get("use_sliding_window"):
        problems.append("use_sliding_window=true (sliding-window attention is not implemented)")
    rope_type = (hf.get("rope_parameters") or {}).get("rope_type", "default")
    if rope_type != "default" or hf.get("rope_scaling"):
        problems.append(f"rope scaling {hf.get('rope_scaling') or rope_type!r} (only plain RoPE is implemented)")
    if float(hf.get("attention_dropout", 0.0) or 0.0) != 0.0:
        problems.append("attention_dropout > 0 (attention dropout is not implemented)")
    if problems:
        raise ConfigError("config.json asks for features xtrain does not implement: " + "; ".join(problems))
