"""Training FLOPs of the model, the numerator of MFU.

Convention (stated because MFU figures are only comparable under one): a training step costs

    6 · N_active · T  +  12 · n_layers · H · d · Σ_docs L(L+1)/2

- ``N_active``: the weights of every matrix multiplication one token goes through, per token: the q/k/v/o
  projections, the dense MLPs, the router and the top-k routed plus shared experts of each MoE layer, and the
  output projection. Embedding lookups, norms and biases are excluded (no matmul, or negligible). 6 = 2 FLOPs
  per multiply-add × 3 (forward, and a backward twice as costly).
- Attention scores and their weighted sum (QKᵀ and P·V, 2·d FLOPs each per query-key pair and head forward,
  ×3 for training) over the pairs a causal mask actually keeps, document by document: a packed row of documents
  of lengths L_i costs Σ L_i(L_i+1)/2 pairs, not T²/2. Work that a kernel skips is not counted, so MFU is honest
  about packing.

No recomputation (activation checkpointing) is counted: MFU counts the model's FLOPs, not the hardware's.
"""

from collections.abc import Sequence

from xtrain.model.config import ModelConfig
from xtrain.model.sizes import count_parameters


def matmul_training_flops_per_token(config: ModelConfig) -> int:
    """6 · N_active: training FLOPs per token of all weight matmuls (independent of document lengths)."""
    return 6 * count_parameters(config).active_matmul


def causal_attention_pairs(doc_lengths: Sequence[int]) -> int:
    """Number of (query, key) pairs a causal mask keeps, summed over the documents of a packed batch."""
    if any(length < 0 for length in doc_lengths):
        raise ValueError(f"document lengths must be non-negative, got {list(doc_lengths)}")
    return sum(length * (length + 1) // 2 for length in doc_lengths)


def attention_training_flops(config: ModelConfig, doc_lengths: Sequence[int]) -> int:
    """Training FLOPs of QKᵀ and P·V over all layers for documents of these lengths (causal, per document)."""
    per_pair = 12 * config.num_layers * config.num_attention_heads * config.head_dim
    return per_pair * causal_attention_pairs(doc_lengths)


def training_flops(config: ModelConfig, doc_lengths: Sequence[int]) -> int:
    """Training FLOPs (forward + backward) of one packed batch holding documents of these lengths."""
    return matmul_training_flops_per_token(config) * sum(doc_lengths) + attention_training_flops(config, doc_lengths)


def training_flops_per_token(config: ModelConfig, doc_lengths: Sequence[int]) -> float:
    """Training FLOPs per token of a packed batch with these document lengths (what MFU divides by time)."""
    num_tokens = sum(doc_lengths)
    if num_tokens == 0:
        raise ValueError("a batch without tokens has no FLOPs per token")
    return training_flops(config, doc_lengths) / num_tokens
