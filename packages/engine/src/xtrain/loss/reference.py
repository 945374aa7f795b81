"""The plain loss the chunked one must equal: full [T, V] logits and torch's cross-entropy.

For tests and tools/bench/chunk_loss.py only: it holds the full logits (and, in backward, several tensors of
that size), which is exactly what the chunked loss exists to avoid.
"""

import torch.nn.functional as F
from torch import Tensor


def full_logits_cross_entropy(
    hidden_TD: Tensor,
    weight_VD: Tensor,
    labels_T: Tensor,
    *,
    normaliser: float | Tensor,
    ignore_index: int = -100,
) -> Tensor:
    """Sum over tokens of CE(hidden @ weight.T, labels), divided by `normaliser`; fp32 scalar.

    Logits come from the matmul in the input dtype and are upcast to fp32 for the cross-entropy, the same
    precision policy as :func:`xtrain.loss.chunked_cross_entropy`.
    """
    logits_TV = hidden_TD @ weight_VD.t()
    loss_sum = F.cross_entropy(logits_TV.float(), labels_T, ignore_index=ignore_index, reduction="sum")
    return loss_sum / normaliser
