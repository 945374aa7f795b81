"""The typed configuration of the decoder (dense Qwen3 or Qwen3-MoE), and its mapping from/to HF config.json.

Unknown fields are rejected (pydantic ``extra="forbid"``). :meth:`ModelConfig.from_hf_config` reads the
``config.json`` of a ``Qwen3ForCausalLM`` or ``Qwen3MoeForCausalLM`` checkpoint and refuses, with a message,
the features this model does not implement (sliding windows, scaled RoPE, other activations), so a checkpoint
is never loaded into a model that would compute something else.
"""

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from xtrain.errors import ConfigError
from xtrain.model.attention_backends import AttentionBackendName
from xtrain.model.moe import MoEConfig

HF_MOE_ARCHITECTURE = "Qwen3MoeForCausalLM"
HF_DENSE_ARCHITECTURE = "Qwen3ForCausalLM"
_HF_MODEL_TYPES = {HF_MOE_ARCHITECTURE: "qwen3_moe", HF_DENSE_ARCHITECTURE: "qwen3"}


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
        return self

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
        return HF_DENSE_ARCHITECTURE if self.moe is None else HF_MOE_ARCHITECTURE

    @classmethod
    def from_hf_config(cls, hf: Mapping[str, Any]) -> "ModelConfig":
        """Translate a Qwen3Config / Qwen3MoeConfig dictionary (the content of config.json)."""
        architecture = hf_architecture_of(hf)
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
        """The config.json content transformers reads back into an equivalent Qwen3 / Qwen3-MoE model."""
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
    raise ConfigError(
        f"architecture {architectures or model_type!r} is not supported; xtrain loads {' and '.join(supported)}"
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
