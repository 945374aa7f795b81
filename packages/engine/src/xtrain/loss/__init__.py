"""The training loss: cross-entropy over the output projection without materialising [tokens, vocab] logits.

- :func:`chunked_cross_entropy`: the loss the trainer calls (gradients produced during the forward).
- :func:`auto_chunk_tokens`: the chunk size for ``loss.chunk_tokens = "auto"`` from a memory budget.
- :func:`full_logits_cross_entropy`: the plain full-logits reference, for tests and the benchmark.
- :func:`peak_allocated_bytes`: the peak allocation of a call, how tests and the benchmark measure memory.
"""

from xtrain.loss.chunk_size import auto_chunk_tokens
from xtrain.loss.chunked import chunked_cross_entropy
from xtrain.loss.peak_memory import peak_allocated_bytes
from xtrain.loss.reference import full_logits_cross_entropy

__all__ = ["auto_chunk_tokens", "chunked_cross_entropy", "full_logits_cross_entropy", "peak_allocated_bytes"]
