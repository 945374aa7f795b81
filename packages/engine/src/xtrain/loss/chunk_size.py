"""How many tokens one chunk of the chunked loss holds: `loss.chunk_tokens = "auto"`.

A chunk's working set is its logits, [C, V]: one buffer in the input dtype that the output projection writes,
plus, for 16-bit inputs, one fp32 buffer where the log-softmax and the logits' gradient are computed (the 16-bit
buffer is then reused for the gradient cast back to the input dtype). Nothing else in the chunked loss grows with
C times V, so the chunk size is the memory budget divided by those bytes per token.

Default budgets, and why:
- CPU, 256 MiB: the weight gradient of the output projection ([V, D] fp32, 0.58 GiB at V=151,936, D=1024) is
  held whatever the chunk size; a chunk buffer well under half of it keeps the loss's peak near that floor,
  while chunks of a few hundred rows still run the three matmuls at the BLAS's full speed and keep the number
  of passes over the [V, D] weight gradient (one read-modify-write per chunk) low. tools/bench/chunk_loss.py
  measures the resulting peak and time against the full-logits loss (docs/benchmarks.md).
- CUDA, 1 GiB: about 1 % of a data-centre GPU's memory; at V=151,936 in bf16 it gives chunks of ~1k tokens,
  enough rows for the tensor cores to run the projection matmuls at full rate.
"""

import torch

CPU_BUDGET_BYTES = 256 * 2**20
CUDA_BUDGET_BYTES = 2**30

# Chunk sizes are rounded down to a multiple of this (when at least this large) so that the matmuls see
# well-aligned row counts.
_ROW_MULTIPLE = 64

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def chunk_bytes_per_token(vocab_size: int, dtype: torch.dtype) -> int:
    """Bytes of chunk working set per token: the logits in `dtype`, plus their fp32 copy for 16-bit dtypes."""
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"chunked loss: dtype {dtype} is not supported; use float32, bfloat16 or float16")
    fp32_copy = 0 if dtype == torch.float32 else 4
    return vocab_size * (dtype.itemsize + fp32_copy)


def default_budget_bytes(device: torch.device | None) -> int:
    """The chunk memory budget used when none is given: 1 GiB on CUDA, 256 MiB elsewhere (see module docstring)."""
    if device is not None and torch.device(device).type == "cuda":
        return CUDA_BUDGET_BYTES
    return CPU_BUDGET_BYTES


def auto_chunk_tokens(
    vocab_size: int,
    dtype: torch.dtype,
    budget_bytes: int | None = None,
    device: torch.device | None = None,
) -> int:
    """The largest chunk (in tokens) whose logits buffers fit in `budget_bytes` (default: per device, see above).

    Rounded down to a multiple of 64 tokens when at least 64 fit; never less than 1.
    """
    if vocab_size < 1:
        raise ValueError(f"chunked loss: vocab_size must be at least 1, got {vocab_size}")
    budget = default_budget_bytes(device) if budget_bytes is None else budget_bytes
    if budget < 1:
        raise ValueError(f"chunked loss: budget_bytes must be positive, got {budget}")
    tokens = budget // chunk_bytes_per_token(vocab_size, dtype)
    if tokens >= _ROW_MULTIPLE:
        return tokens - tokens % _ROW_MULTIPLE
    return max(1, tokens)
