"""Tiny random DeepSeek-V3 and GPT-OSS models built with transformers itself, in fp32 with eager attention and
eager experts: the references the family parity tests compare xtrain against (everything offline)."""

from typing import Any

import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, GptOssConfig, GptOssForCausalLM

# YaRN as the published checkpoints use it (DeepSeek-V3: factor 40 and mscale_all_dim, so the softmax scale is
# corrected; GPT-OSS: factor 32, truncate False), with a short original context so that the ramp lies inside
# the tiny rotary dimensions.
DEEPSEEK_YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 40.0,
    "original_max_position_embeddings": 64,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
GPT_OSS_YARN = {
    "rope_type": "yarn",
    "rope_theta": 150000.0,
    "factor": 32.0,
    "original_max_position_embeddings": 64,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
}


def _perturb(model: torch.nn.Module, scale: float = 0.2) -> None:
    """Move every weight initialised to a constant (norms at one, biases, the correction bias, sinks at zero)
    away from it, so that a mistake anywhere shows in the logits."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + scale * torch.randn_like(param))
            elif name.endswith(("bias", "sinks")):
                param.copy_(scale * torch.randn_like(param))
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.05 * torch.randn_like(buffer))


def build_deepseek_v3(seed: int, **overrides: Any) -> DeepseekV3ForCausalLM:
    settings: dict[str, Any] = {
        "vocab_size": 96,
        "hidden_size": 64,
        "intermediate_size": 80,
        "moe_intermediate_size": 24,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "n_group": 4,
        "topk_group": 2,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1,
        "q_lora_rank": 24,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 12,
        "qk_rope_head_dim": 8,
        "v_head_dim": 10,
        "rope_interleave": True,
        "rope_parameters": DEEPSEEK_YARN,
        "max_position_embeddings": 2560,
        "initializer_range": 0.1,
        "num_nextn_predict_layers": 0,
        "attn_implementation": "eager",
        "experts_implementation": "eager",
        **overrides,
    }
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**settings))
    _perturb(model)
    return model.float().eval()


def build_gpt_oss(seed: int, **overrides: Any) -> GptOssForCausalLM:
    settings: dict[str, Any] = {
        "vocab_size": 96,
        "hidden_size": 64,
        "intermediate_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "sliding_window": 4,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "rope_parameters": GPT_OSS_YARN,
        "max_position_embeddings": 2048,
        "initializer_range": 0.1,
        # A limit the tiny activations reach, so the clamps are exercised.
        "swiglu_limit": 0.5,
        "attn_implementation": "eager",
        "experts_implementation": "eager",
        **overrides,
    }
    torch.manual_seed(seed)
    model = GptOssForCausalLM(GptOssConfig(**settings))
    _perturb(model)
    # Sinks large enough to take a visible share of each softmax.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("sinks"):
                param.copy_(torch.randn_like(param))
    return model.float().eval()


def hf_gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Gradients under the checkpoint keys and layout transformers 5 saves (per-expert for DeepSeek-V3, the
    fused in-memory layout for GPT-OSS, which save_pretrained writes as is)."""
    grads: dict[str, torch.Tensor] = {}
    per_expert = isinstance(model, DeepseekV3ForCausalLM)
    for name, param in model.named_parameters():
        grad = torch.zeros_like(param) if param.grad is None else param.grad
        if per_expert and name.endswith("mlp.experts.gate_up_proj"):
            prefix = name.removesuffix("gate_up_proj")
            half = grad.shape[1] // 2
            for e in range(grad.shape[0]):
                grads[f"{prefix}{e}.gate_proj.weight"] = grad[e, :half]
                grads[f"{prefix}{e}.up_proj.weight"] = grad[e, half:]
        elif per_expert and name.endswith("mlp.experts.down_proj"):
            prefix = name.removesuffix("down_proj")
            for e in range(grad.shape[0]):
                grads[f"{prefix}{e}.down_proj.weight"] = grad[e]
        else:
            grads[name] = grad
    return grads
