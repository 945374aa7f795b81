"""Typed configuration of one MoE block, and its reading from Hugging Face `config.json` dictionaries."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

RouterKind = Literal["softmax_topk", "sigmoid_group_limited", "topk_softmax"]
ExpertActivation = Literal["swiglu", "clamped_swiglu"]
ExpertsImpl = Literal["auto", "grouped_mm", "loop", "cpu_fused"]


class UnsupportedHFMoEConfigError(ValueError):
    """A Hugging Face config asks for an MoE variant this block does not implement."""


def _need(hf_config: dict[str, Any], key: str) -> Any:
    if key not in hf_config:
        raise UnsupportedHFMoEConfigError(f"MoE config lacks the key {key!r}: add it to config.json")
    return hf_config[key]


class MoEConfig(BaseModel):
    """Configuration of one Mixture-of-Experts block (router, routed experts, optional shared experts)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_experts: int = Field(gt=0)
    """Number of routed experts E."""

    num_experts_per_tok: int = Field(gt=0)
    """Experts each token is routed to (top-k)."""

    moe_intermediate_size: int = Field(gt=0)
    """Hidden size F of each routed expert's SwiGLU MLP."""

    norm_topk_prob: bool = True
    """Renormalise the k selected routing weights to sum to one (Qwen3-MoE `norm_topk_prob`)."""

    router: RouterKind = "softmax_topk"
    """`softmax_topk` (Qwen3-MoE), `sigmoid_group_limited` (DeepSeek-V3 `noaux_tc`: sigmoid scores, top groups
    by the sum of their two best biased scores, then top-k inside those groups), or `topk_softmax` (GPT-OSS:
    top-k of the logits, then a softmax over the k selected)."""

    router_bias: bool = False
    """A learned bias on the router logits (GPT-OSS `router.bias`)."""

    expert_bias: bool = False
    """Biases on each expert's gate/up and down projections (GPT-OSS); computed by `BiasedExperts`."""

    expert_activation: ExpertActivation = "swiglu"
    """`swiglu`: silu(gate) * up. `clamped_swiglu` (GPT-OSS): gate clamped above at `swiglu_limit`, up clamped
    to ±`swiglu_limit`, then (up + 1) * gate * sigmoid(`swiglu_alpha` * gate)."""

    swiglu_alpha: float = 1.702
    """Slope inside the sigmoid of the clamped SwiGLU."""

    swiglu_limit: float = Field(default=7.0, gt=0)
    """Clamp limit of the clamped SwiGLU."""

    n_group: int = Field(default=1, gt=0)
    """Number of expert groups for the group-limited router (1: no group limit)."""

    topk_group: int = Field(default=1, gt=0)
    """Groups each token may select experts from (group-limited router only)."""

    routed_scaling_factor: float = 1.0
    """Factor applied to the routing weights after normalisation (DeepSeek-V3 uses 2.5)."""

    num_shared_experts: int = Field(default=0, ge=0)
    """Shared experts every token passes through; they are fused into one SwiGLU MLP (0: none)."""

    shared_expert_intermediate_size: int | None = Field(default=None, gt=0)
    """Hidden size of the fused shared-expert MLP; defaults to `moe_intermediate_size * num_shared_experts`."""

    aux_loss_coef: float = Field(default=0.0, ge=0.0)
    """Weight of the global load-balancing loss (HF `router_aux_loss_coef`); the trainer applies it."""

    z_loss_coef: float = Field(default=0.0, ge=0.0)
    """Weight of the router z-loss (mean of logsumexp(logits)^2); the trainer applies it."""

    bias_update_rate: float = Field(default=0.001, ge=0.0)
    """Step of the aux-loss-free balancing update of `e_score_correction_bias` (DeepSeek-V3's gamma)."""

    experts_impl: ExpertsImpl = "auto"
    """Expert compute. `auto` (the default) picks the fastest correct path for the device and dtype: `cpu_fused`
    on the CPU in eager mode (fp32, bf16, fp16 with 16-byte aligned rows; whole, unbiased experts), else
    `grouped_mm` where torch's kernel runs (bf16 on CUDA from compute capability 8.0, the CPU under
    torch.compile, expert-parallel rows), else `loop` (docs/engine-moe.md has the table). The others force a
    path and raise a `ValueError` where it cannot run: `cpu_fused` (`FusedExpertsCPU`: dispatch, both matmuls,
    the weighted SwiGLU and the combine fused expert by expert, no [slots, hidden] temporary), `grouped_mm`
    (torch's grouped matmul between separate dispatch and combine), `loop` (one matmul per expert, the portable
    reference)."""

    init_std: float = Field(default=0.02, gt=0.0)
    """Standard deviation of the normal initialisation of router and expert weights."""

    @model_validator(mode="after")
    def _check_shapes(self) -> MoEConfig:
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"num_experts_per_tok={self.num_experts_per_tok} exceeds num_experts={self.num_experts}: "
                "lower num_experts_per_tok"
            )
        if self.router == "sigmoid_group_limited":
            if self.num_experts % self.n_group:
                raise ValueError(
                    f"num_experts={self.num_experts} is not divisible by n_group={self.n_group}: "
                    "choose n_group dividing num_experts"
                )
            if self.topk_group > self.n_group:
                raise ValueError(f"topk_group={self.topk_group} exceeds n_group={self.n_group}")
            per_group = self.num_experts // self.n_group
            if per_group < 2 and self.n_group > 1:
                raise ValueError(
                    "the group-limited router scores a group by its two best experts: "
                    f"num_experts/n_group={per_group} must be at least 2"
                )
            if self.num_experts_per_tok > self.topk_group * per_group:
                raise ValueError(
                    f"num_experts_per_tok={self.num_experts_per_tok} exceeds the experts reachable in "
                    f"topk_group={self.topk_group} groups of {per_group}: raise topk_group"
                )
        elif self.n_group != 1 or self.topk_group != 1:
            raise ValueError("n_group/topk_group apply to router='sigmoid_group_limited' only: leave them at 1")
        if self.biased_experts != (self.router == "topk_softmax"):
            raise ValueError(
                "expert biases and the clamped SwiGLU come with the GPT-OSS router (router='topk_softmax'): "
                "set all three or none"
            )
        if self.shared_expert_intermediate_size is not None and self.num_shared_experts == 0:
            raise ValueError("shared_expert_intermediate_size is set but num_shared_experts=0: set both or neither")
        return self

    @property
    def biased_experts(self) -> bool:
        """Experts with GPT-OSS's biases or clamped SwiGLU (`BiasedExperts`); the rest are `GroupedExperts`."""
        return self.expert_bias or self.expert_activation != "swiglu"

    @property
    def shared_intermediate_size(self) -> int:
        """Hidden size of the fused shared-expert MLP (0 without shared experts)."""
        if self.num_shared_experts == 0:
            return 0
        if self.shared_expert_intermediate_size is not None:
            return self.shared_expert_intermediate_size
        return self.moe_intermediate_size * self.num_shared_experts

    @classmethod
    def from_hf_config(cls, hf_config: dict[str, Any]) -> MoEConfig:
        """Read the MoE part of a Hugging Face `config.json` (Qwen3-MoE or DeepSeek-V3 keys).

        Keys of the rest of the model are ignored; an MoE variant this block cannot compute raises
        `UnsupportedHFMoEConfigError` naming the key.
        """
        if "n_routed_experts" in hf_config:
            return cls._from_deepseek(hf_config)
        if "num_experts" in hf_config or "num_local_experts" in hf_config:
            return cls._from_qwen(hf_config)
        raise UnsupportedHFMoEConfigError(
            "config has none of 'num_experts'/'num_local_experts' (Qwen3-MoE) or 'n_routed_experts' (DeepSeek-V3): "
            "not an MoE config this block can read"
        )

    @classmethod
    def _from_qwen(cls, c: dict[str, Any]) -> MoEConfig:
        if c.get("shared_expert_intermediate_size"):
            # Qwen2-MoE's shared expert is scaled by its own sigmoid gate; this block has no such gate.
            raise UnsupportedHFMoEConfigError(
                "key 'shared_expert_intermediate_size': Qwen2-MoE's gated shared expert is not supported"
            )
        act = c.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedHFMoEConfigError(f"key 'hidden_act'={act!r}: only 'silu' (SwiGLU) is supported")
        return cls(
            # Hub checkpoints write `num_experts`; transformers 5.x's own to_dict writes `num_local_experts`.
            num_experts=_need(c, "num_experts") if "num_experts" in c else _need(c, "num_local_experts"),
            num_experts_per_tok=_need(c, "num_experts_per_tok"),
            moe_intermediate_size=_need(c, "moe_intermediate_size"),
            norm_topk_prob=c.get("norm_topk_prob", False),
            router="softmax_topk",
            aux_loss_coef=c.get("router_aux_loss_coef", 0.0) or 0.0,
            z_loss_coef=c.get("router_z_loss_coef", 0.0) or 0.0,
        )

    @classmethod
    def _from_deepseek(cls, c: dict[str, Any]) -> MoEConfig:
        scoring = c.get("scoring_func", "sigmoid")
        method = c.get("topk_method", "noaux_tc")
        act = c.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedHFMoEConfigError(f"key 'hidden_act'={act!r}: only 'silu' (SwiGLU) is supported")
        n_group = c.get("n_group") or 1
        topk_group = c.get("topk_group") or 1
        if scoring == "sigmoid" and method == "noaux_tc":
            router: RouterKind = "sigmoid_group_limited"
        elif scoring == "softmax" and method == "greedy":
            router = "softmax_topk"
            n_group, topk_group = 1, 1
        else:
            raise UnsupportedHFMoEConfigError(
                f"keys 'scoring_func'={scoring!r}, 'topk_method'={method!r}: supported are "
                "sigmoid+noaux_tc (DeepSeek-V3) and softmax+greedy"
            )
        n_shared = c.get("n_shared_experts") or 0
        return cls(
            num_experts=_need(c, "n_routed_experts"),
            num_experts_per_tok=_need(c, "num_experts_per_tok"),
            moe_intermediate_size=_need(c, "moe_intermediate_size"),
            norm_topk_prob=c.get("norm_topk_prob", True),
            router=router,
            n_group=n_group,
            topk_group=topk_group,
            routed_scaling_factor=c.get("routed_scaling_factor", 1.0),
            num_shared_experts=n_shared,
            # DeepSeek's sequence-wise balance loss weight; here it weights the global-batch loss.
            aux_loss_coef=c.get("aux_loss_alpha", 0.0) or 0.0,
        )
