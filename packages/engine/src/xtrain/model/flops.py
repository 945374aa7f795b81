"""Training FLOPs of the model, the numerator of MFU.

Convention (stated because MFU figures are only comparable under one): a training step costs

    6 · N_active · T  +  Σ_layers 6 · H · (d_qk + d_v) · pairs(layer)

- ``N_active``: the weights of every matrix multiplication one token goes through, per token: the q/k/v/o
  projections, the dense MLPs, the router and the top-k routed plus shared experts of each MoE layer, and the
  output projection. Embedding lookups, norms and biases are excluded (no matmul, or negligible). 6 = 2 FLOPs
  per multiply-add × 3 (forward, and a backward twice as costly).
- Attention scores and their weighted sum (QKᵀ costs 2·d_qk and P·V 2·d_v FLOPs per query-key pair and head
  forward, ×3 for training; d_qk = d_v = head_dim except in multi-head latent attention, where d_qk is
  qk_nope + qk_rope and d_v is v_head_dim) over the pairs a causal mask actually keeps, document by document: a
  packed row of documents of lengths L_i costs Σ L_i(L_i+1)/2 pairs, not T²/2; a sliding-window layer of window
  W keeps Σ_i min(i + 1, W) pairs per document. Work that a kernel skips is not counted, so MFU is honest about
  packing. (MLA is counted as computed here and in transformers: keys and values expanded per head; the
  latent "absorbed" form of inference kernels is not what training runs.) Sinks add one logit per query and
  head: negligible, not counted.

No recomputation (activation checkpointing) is counted: MFU counts the model's FLOPs, not the hardware's.
"""

import functools
from collections import Counter
from collections.abc import Sequence

from xtrain.model.config import ModelConfig
from xtrain.model.sizes import count_parameters


@functools.lru_cache(maxsize=16)  # a configuration is immutable; the planner's search asks thousands of times
def matmul_training_flops_per_token(config: ModelConfig) -> int:
    """6 · N_active: training FLOPs per token of all weight matmuls (independent of document lengths)."""
    return 6 * count_parameters(config).active_matmul


def causal_attention_pairs(doc_lengths: Sequence[int], window: int | None = None) -> int:
    """Number of (query, key) pairs a causal mask keeps (within ``window`` keys, the query's own included, when
    given), summed over the documents of a packed batch."""
    if any(length < 0 for length in doc_lengths):
        raise ValueError(f"document lengths must be non-negative, got {list(doc_lengths)}")
    if window is None:
        return sum(length * (length + 1) // 2 for length in doc_lengths)
    # The first W queries see 1..W keys, every later one exactly W.
    return sum(
        min(length, window) * (min(length, window) + 1) // 2 + max(length - window, 0) * window
        for length in doc_lengths
    )


def attention_training_flops(config: ModelConfig, doc_lengths: Sequence[int]) -> int:
    """Training FLOPs of QKᵀ and P·V over all layers for documents of these lengths (causal, per document)."""
    per_pair = 6 * config.num_attention_heads * (config.head_dim + config.value_head_dim)
    return per_pair * sum(
        layers * causal_attention_pairs(doc_lengths, window) for window, layers in _layers_by_window(config)
    )


@functools.lru_cache(maxsize=16)
def _layers_by_window(config: ModelConfig) -> tuple[tuple[int | None, int], ...]:
    """(window, how many layers have it): None for full attention."""
    return tuple(Counter(config.layer_window(i) for i in range(config.num_layers)).items())


def training_flops(config: ModelConfig, doc_lengths: Sequence[int]) -> int:
    """Training FLOPs (forward + backward) of one packed batch holding documents of these lengths."""
    return matmul_training_flops_per_token(config) * sum(doc_lengths) + attention_training_flops(config, doc_lengths)


def training_flops_per_token(config: ModelConfig, doc_lengths: Sequence[int]) -> float:
    """Training FLOPs per token of a packed batch with these document lengths (what MFU divides by time)."""
    num_tokens = sum(doc_lengths)
    if num_tokens == 0:
        raise ValueError("a batch without tokens has no FLOPs per token")
    return training_flops(config, doc_lengths) / num_tokens
