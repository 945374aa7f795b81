"""Reference MoE blocks from transformers (a development dependency) with weights copied into xtrain's block."""

from __future__ import annotations

from typing import Any

import torch
from xtrain.model.moe import MoEBlock, MoEConfig


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative L2 error of `got` against `want`."""
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


def build_qwen3_pair(
    *,
    hidden: int,
    experts: int,
    top_k: int,
    inter: int,
    norm_topk_prob: bool,
    experts_impl: str = "auto",
    seed: int = 0,
) -> tuple[Any, MoEBlock]:
    """transformers' Qwen3-MoE sparse block with random weights, and an xtrain MoEBlock holding the same."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    hf_cfg = Qwen3MoeConfig(
        hidden_size=hidden,
        moe_intermediate_size=inter,
        num_experts=experts,
        num_experts_per_tok=top_k,
        norm_topk_prob=norm_topk_prob,
    )
    hf_cfg._experts_implementation = "eager"  # transformers' plainest form is the reference
    torch.manual_seed(seed)
    hf = Qwen3MoeSparseMoeBlock(hf_cfg)
    _randomise(hf)
    cfg = MoEConfig.from_hf_config(hf_cfg.to_dict()).model_copy(update={"experts_impl": experts_impl})
    ours = MoEBlock(hidden, cfg)
    ours.load_state_dict(
        {
            "router.weight": hf.gate.weight.detach().clone(),
            "experts.gate_up_proj": hf.experts.gate_up_proj.detach().clone(),
            "experts.down_proj": hf.experts.down_proj.detach().clone(),
        }
    )
    return hf, ours


def build_deepseek_pair(
    *,
    hidden: int,
    experts: int,
    top_k: int,
    inter: int,
    n_group: int,
    topk_group: int,
    n_shared: int,
    scaling: float = 2.5,
    seed: int = 0,
    experts_impl: str = "auto",
) -> tuple[Any, MoEBlock]:
    """transformers' DeepSeek-V3 MoE block (sigmoid group-limited router, shared experts) and its xtrain twin."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    hf_cfg = DeepseekV3Config(
        hidden_size=hidden,
        moe_intermediate_size=inter,
        n_routed_experts=experts,
        num_experts_per_tok=top_k,
        n_group=n_group,
        topk_group=topk_group,
        n_shared_experts=n_shared,
        routed_scaling_factor=scaling,
        norm_topk_prob=True,
    )
    hf_cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    hf = DeepseekV3MoE(hf_cfg)
    _randomise(hf)
    cfg_dict = hf_cfg.to_dict() | {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}
    ours = MoEBlock(hidden, MoEConfig.from_hf_config(cfg_dict).model_copy(update={"experts_impl": experts_impl}))
    state = {
        "router.weight": hf.gate.weight.detach().clone(),
        "router.e_score_correction_bias": hf.gate.e_score_correction_bias.detach().clone(),
        "experts.gate_up_proj": hf.experts.gate_up_proj.detach().clone(),
        "experts.down_proj": hf.experts.down_proj.detach().clone(),
    }
    for name in ("gate_proj", "up_proj", "down_proj"):
        state[f"shared_experts.{name}.weight"] = getattr(hf.shared_experts, name).weight.detach().clone()
    ours.load_state_dict(state)
    return hf, ours


def _randomise(hf_block: torch.nn.Module) -> None:
    # Decisive router logits (no near-ties in the top-k) and expert outputs of order one.
    with torch.no_grad():
        for name, p in hf_block.named_parameters():
            p.normal_(0.0, 0.5 if name.startswith("gate.") else 0.2)
