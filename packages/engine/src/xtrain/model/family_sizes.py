"""Named sizes of the DeepSeek-V3 and GPT-OSS families: the shapes of the published checkpoints' config.json
(deepseek-ai/DeepSeek-V3, moonshotai/Kimi-K2-Instruct, openai/gpt-oss-20b, openai/gpt-oss-120b), for FLOP and
memory estimates. Multi-token-prediction layers (DeepSeek-V3's one) are recorded but not counted: they are not
part of the 671B the model is published as."""

from xtrain.model.config import ModelConfig
from xtrain.model.mla import MLAConfig
from xtrain.model.moe import MoEConfig
from xtrain.model.rope import YarnScaling

_MLA = MLAConfig(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)


def deepseek_v3_671b() -> ModelConfig:
    return ModelConfig(
        family="deepseek_v3",
        vocab_size=129280,
        hidden_size=7168,
        num_layers=61,
        num_attention_heads=128,
        num_kv_heads=128,
        head_dim=_MLA.qk_head_dim,
        intermediate_size=18432,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        rope_scaling=YarnScaling(
            factor=40.0,
            original_max_position_embeddings=4096,
            beta_fast=32,
            beta_slow=1,
            mscale=1.0,
            mscale_all_dim=1.0,
        ),
        max_position_embeddings=163840,
        moe=MoEConfig(
            num_experts=256,
            num_experts_per_tok=8,
            moe_intermediate_size=2048,
            norm_topk_prob=True,
            router="sigmoid_group_limited",
            n_group=8,
            topk_group=4,
            routed_scaling_factor=2.5,
            num_shared_experts=1,
            aux_loss_coef=0.001,
        ),
        mlp_only_layers=(0, 1, 2),  # first_k_dense_replace = 3
        mla=_MLA,
        num_nextn_predict_layers=1,
        bos_token_id=0,
        eos_token_id=1,
    )


def kimi_k2_1t() -> ModelConfig:
    return ModelConfig(
        family="deepseek_v3",
        vocab_size=163840,
        hidden_size=7168,
        num_layers=61,
        num_attention_heads=64,
        num_kv_heads=64,
        head_dim=_MLA.qk_head_dim,
        intermediate_size=18432,
        rms_norm_eps=1e-6,
        rope_theta=50000.0,
        rope_scaling=YarnScaling(
            factor=32.0, original_max_position_embeddings=4096, beta_fast=1, beta_slow=1, mscale=1.0, mscale_all_dim=1.0
        ),
        max_position_embeddings=131072,
        moe=MoEConfig(
            num_experts=384,
            num_experts_per_tok=8,
            moe_intermediate_size=2048,
            norm_topk_prob=True,
            router="sigmoid_group_limited",
            n_group=1,
            topk_group=1,
            routed_scaling_factor=2.827,
            num_shared_experts=1,
            aux_loss_coef=0.001,
        ),
        mlp_only_layers=(0,),  # first_k_dense_replace = 1
        mla=_MLA,
        bos_token_id=163584,
        eos_token_id=163585,
    )


def _gpt_oss(num_layers: int, num_experts: int) -> ModelConfig:
    return ModelConfig(
        family="gpt_oss",
        vocab_size=201088,
        hidden_size=2880,
        num_layers=num_layers,
        num_attention_heads=64,
        num_kv_heads=8,
        head_dim=64,
        intermediate_size=2880,
        rms_norm_eps=1e-5,
        rope_theta=150000.0,
        rope_scaling=YarnScaling(
            factor=32.0, original_max_position_embeddings=4096, beta_fast=32, beta_slow=1, truncate=False
        ),
        max_position_embeddings=131072,
        attention_bias=True,
        moe=MoEConfig(
            num_experts=num_experts,
            num_experts_per_tok=4,
            moe_intermediate_size=2880,
            norm_topk_prob=False,
            router="topk_softmax",
            router_bias=True,
            expert_bias=True,
            expert_activation="clamped_swiglu",
            swiglu_alpha=1.702,
            swiglu_limit=7.0,
            aux_loss_coef=0.9,
        ),
        layer_types=tuple("sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)),
        sliding_window=128,
        attention_sinks=True,
        eos_token_id=200002,
    )


def gpt_oss_20b() -> ModelConfig:
    return _gpt_oss(num_layers=24, num_experts=32)


def gpt_oss_120b() -> ModelConfig:
    return _gpt_oss(num_layers=36, num_experts=128)
