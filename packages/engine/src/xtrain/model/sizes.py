"""Named model sizes and parameter counts.

- ``debug``: a tiny Qwen3-MoE-shaped model for tests and the demo (runs on a laptop CPU in milliseconds).
- ``debug-dense``: the same without experts (a Qwen3 dense model).
- ``cpu-moe``: a larger Qwen3-MoE-shaped model that still trains on a CPU in seconds (6 layers, 16 experts of
  which 4 per token, hidden 256): the second model of tools/bench/plan_accuracy.py, where the sharded state and
  the activations weigh differently than in ``debug``.
- ``qwen3-30b-a3b`` and ``qwen3-235b-a22b``: the shapes of the released Qwen/Qwen3-30B-A3B and
  Qwen/Qwen3-235B-A22B checkpoints (their config.json values), used for FLOP and memory estimates.
- ``deepseek-v3-671b``, ``kimi-k2-1t``, ``gpt-oss-20b``, ``gpt-oss-120b``: the published DeepSeek-V3, Kimi K2 and
  GPT-OSS shapes (:mod:`xtrain.model.family_sizes`).

Counts are computed from the configuration alone (no tensors); a test checks them against the parameters of a
model built on the meta device and against the published totals.
"""

from collections.abc import Callable
from dataclasses import dataclass

from xtrain.errors import ConfigError
from xtrain.model.config import ModelConfig
from xtrain.model.family_sizes import deepseek_v3_671b, gpt_oss_20b, gpt_oss_120b, kimi_k2_1t
from xtrain.model.moe import MoEConfig


@dataclass(frozen=True)
class ParameterCounts:
    total: int
    """Every trainable parameter."""
    active: int
    """Parameters one token uses: total minus the routed experts it is not sent to (embeddings included, the
    convention of the "A3B" / "A22B" in the model names)."""
    embedding: int
    """The input embedding matrix (plus the output projection when it is a separate matrix)."""
    active_matmul: int
    """Weights of the matrix multiplications one token goes through (the N of 6·N in :mod:`xtrain.model.flops`):
    active, minus embedding lookup, norms and biases, plus the output projection even when tied."""

    @property
    def active_without_input_embedding(self) -> int:
        """Active parameters without the input embedding (a lookup, not compute): OpenAI's convention for the
        GPT-OSS figures (3.6B / 5.1B). A tied embedding is the output projection as well and stays counted."""
        return self.active - (self.embedding // 2 if self.embedding_untied else 0)

    embedding_untied: bool = True
    """Whether the output projection is a matrix of its own (``embedding`` then counts two matrices)."""


def _debug() -> ModelConfig:
    return ModelConfig(
        vocab_size=512,
        hidden_size=128,
        num_layers=4,
        num_attention_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=384,
        rope_theta=10_000.0,
        max_position_embeddings=4096,
        moe=MoEConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True),
        # Layer 0 dense, as in models that keep their first layers dense: the tests see both kinds.
        mlp_only_layers=(0,),
    )


def _debug_dense() -> ModelConfig:
    return _debug().model_copy(update={"moe": None, "mlp_only_layers": (), "tie_word_embeddings": True})


def _cpu_moe() -> ModelConfig:
    return ModelConfig(
        vocab_size=1024,
        hidden_size=256,
        num_layers=6,
        num_attention_heads=8,
        num_kv_heads=4,
        head_dim=32,
        intermediate_size=768,
        rope_theta=10_000.0,
        max_position_embeddings=16384,
        moe=MoEConfig(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=128, norm_topk_prob=True),
        mlp_only_layers=(0,),
    )


def _qwen3_30b_a3b() -> ModelConfig:
    # Qwen/Qwen3-30B-A3B config.json.
    return ModelConfig(
        vocab_size=151936,
        hidden_size=2048,
        num_layers=48,
        num_attention_heads=32,
        num_kv_heads=4,
        head_dim=128,
        intermediate_size=6144,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        moe=MoEConfig(
            num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True, aux_loss_coef=0.001
        ),
        decoder_sparse_step=1,
        bos_token_id=151643,
        eos_token_id=151645,
    )


def _qwen3_235b_a22b() -> ModelConfig:
    # Qwen/Qwen3-235B-A22B config.json.
    return ModelConfig(
        vocab_size=151936,
        hidden_size=4096,
        num_layers=94,
        num_attention_heads=64,
        num_kv_heads=4,
        head_dim=128,
        intermediate_size=12288,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        moe=MoEConfig(
            num_experts=128, num_experts_per_tok=8, moe_intermediate_size=1536, norm_topk_prob=True, aux_loss_coef=0.001
        ),
        decoder_sparse_step=1,
        bos_token_id=151643,
        eos_token_id=151645,
    )


MODEL_SIZES: dict[str, Callable[[], ModelConfig]] = {
    "debug": _debug,
    "debug-dense": _debug_dense,
    "cpu-moe": _cpu_moe,
    "qwen3-30b-a3b": _qwen3_30b_a3b,
    "qwen3-235b-a22b": _qwen3_235b_a22b,
    "deepseek-v3-671b": deepseek_v3_671b,
    "kimi-k2-1t": kimi_k2_1t,
    "gpt-oss-20b": gpt_oss_20b,
    "gpt-oss-120b": gpt_oss_120b,
}


def model_config(name: str) -> ModelConfig:
    """The configuration of a named size (see MODEL_SIZES)."""
    try:
        return MODEL_SIZES[name]()
    except KeyError:
        raise ConfigError(f"unknown model size {name!r}; choose one of {', '.join(MODEL_SIZES)}") from None


def count_parameters(config: ModelConfig) -> ParameterCounts:
    d_model, vocab = config.hidden_size, config.vocab_size
    attention_matmul, attention_small = _attention_parameters(config)
    per_layer_small = 2 * d_model + attention_small  # two layer norms, plus attention's norms, biases, sinks
    dense_mlp = 3 * d_model * config.intermediate_size

    total = vocab * d_model + d_model  # embedding + final norm
    active_matmul = vocab * d_model  # output projection (tied or not)
    if not config.tie_word_embeddings:
        total += vocab * d_model
    inactive = 0
    for i in range(config.num_layers):
        total += attention_matmul + per_layer_small
        active_matmul += attention_matmul
        if config.is_moe_layer(i):
            assert config.moe is not None
            moe = _moe_parameters(d_model, config.moe)
            total += moe.routed_total + moe.shared + moe.router + moe.router_bias
            active_matmul += moe.routed_active_matmul + moe.shared + moe.router
            inactive += moe.routed_inactive
        else:
            total += dense_mlp
            active_matmul += dense_mlp
    embedding = vocab * d_model * (1 if config.tie_word_embeddings else 2)
    return ParameterCounts(
        total=total,
        active=total - inactive,
        embedding=embedding,
        active_matmul=active_matmul,
        embedding_untied=not config.tie_word_embeddings,
    )


def _attention_parameters(config: ModelConfig) -> tuple[int, int]:
    """(matmul weights, everything else: norms, biases, sinks) of one layer's attention."""
    d_model, heads = config.hidden_size, config.num_attention_heads
    mla = config.mla
    if mla is not None:
        c, r, n, v = mla.kv_lora_rank, mla.qk_rope_head_dim, mla.qk_nope_head_dim, mla.v_head_dim
        d_qk = mla.qk_head_dim
        if mla.q_lora_rank is None:
            query, query_small, query_bias = d_model * heads * d_qk, 0, 0
        else:
            q = mla.q_lora_rank
            query, query_small, query_bias = d_model * q + q * heads * d_qk, q, q
        matmul = query + d_model * (c + r) + c * heads * (n + v) + heads * v * d_model
        bias = (query_bias + c + r + d_model) if config.attention_bias else 0
        return matmul, query_small + c + bias
    q_width = heads * config.head_dim
    kv_width = config.num_kv_heads * config.head_dim
    matmul = d_model * q_width * 2 + d_model * kv_width * 2
    small = (q_width + 2 * kv_width + d_model) if config.attention_bias else 0
    if config.qk_norm:
        small += 2 * config.head_dim
    if config.attention_sinks:
        small += heads
    return matmul, small


@dataclass(frozen=True)
class _MoEParameters:
    routed_total: int
    routed_active_matmul: int
    routed_inactive: int
    shared: int
    router: int
    router_bias: int


def _moe_parameters(d_model: int, moe: MoEConfig) -> _MoEParameters:
    """Parameter counts of one MoE layer."""
    f = moe.moe_intermediate_size
    expert_matmul = 3 * d_model * f
    expert = expert_matmul + ((2 * f + d_model) if moe.expert_bias else 0)
    return _MoEParameters(
        routed_total=moe.num_experts * expert,
        routed_active_matmul=moe.num_experts_per_tok * expert_matmul,
        routed_inactive=(moe.num_experts - moe.num_experts_per_tok) * expert,
        shared=3 * d_model * moe.shared_intermediate_size,
        router=moe.num_experts * d_model,
        router_bias=moe.num_experts if moe.router_bias else 0,
    )
