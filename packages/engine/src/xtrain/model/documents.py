"""The documents packed into one row: boundaries, lengths and per-document positions.

A batch is one row of T tokens holding several documents back to back; ``cu_seqlens`` (int32 [N+1]) gives their
boundaries (0, end of doc 0, end of doc 1, ..., T). Attention never crosses a boundary and rotary positions
restart at 0 in each document. The lengths are read to the host once per forward (one device sync), because
the per-document attention path and the flash kernels both need them as Python ints; a caller that knows the
lengths on the host already (the packer) builds :meth:`PackedDocuments.from_lengths` and passes it to the model
instead, which avoids the sync.

Under ``torch.compile`` the ``sdpa`` path reads only ``position_ids`` (shape [T] whatever the documents), never the
host lengths, so a compiled layer serves every pack of the same row length (see :mod:`xtrain.model.document_sdpa`).
The CUDA varlen kernels take ``cu_seqlens`` and ``max_seqlen`` (an int), which compile guards on.
"""

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class PackedDocuments:
    """Boundaries of the documents in a packed row, validated, with host-side lengths."""

    cu_seqlens: Tensor
    """int32 [N+1] on the compute device: 0, cumulative end of each document."""
    lengths: tuple[int, ...]
    """Length of each document (host ints, N of them)."""
    position_ids: Tensor
    """int64 [T] on the compute device: the position of each token inside its own document."""

    @property
    def max_seqlen(self) -> int:
        return max(self.lengths)

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    @classmethod
    def from_lengths(cls, lengths: Sequence[int], device: torch.device) -> "PackedDocuments":
        """From host-side document lengths (what a packer knows anyway): no device sync at all."""
        as_tuple = tuple(int(length) for length in lengths)
        if not as_tuple or min(as_tuple) <= 0:
            raise ValueError(f"document lengths must be positive and at least one, got {list(as_tuple)}")
        bounds = [0, *itertools.accumulate(as_tuple)]
        return cls._build(torch.tensor(bounds, dtype=torch.int32, device=device), as_tuple, device)

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens: Tensor | None, num_tokens: int, device: torch.device) -> "PackedDocuments":
        """Validate ``cu_seqlens`` against a row of ``num_tokens`` tokens (None means a single document)."""
        if num_tokens <= 0:
            raise ValueError("the packed row is empty: input_ids must hold at least one token")
        if cu_seqlens is None:
            lengths: tuple[int, ...] = (num_tokens,)
            cu = torch.tensor([0, num_tokens], dtype=torch.int32, device=device)
        else:
            if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
                raise ValueError(
                    f"cu_seqlens must be a 1-D int32 tensor [num_docs+1], got {cu_seqlens.dtype} "
                    f"of shape {tuple(cu_seqlens.shape)}"
                )
            bounds = [int(b) for b in cu_seqlens.tolist()]
            if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != num_tokens:
                raise ValueError(
                    f"cu_seqlens must start at 0 and end at the row length {num_tokens}, got {bounds[:3]}..."
                    f"{bounds[-1:]} ({len(bounds)} entries)"
                )
            lengths = tuple(end - start for start, end in itertools.pairwise(bounds))
            if min(lengths) <= 0:
                raise ValueError(f"cu_seqlens must be strictly increasing (no empty documents), got {bounds}")
            cu = cu_seqlens.to(device=device, dtype=torch.int32)
        return cls._build(cu, lengths, device)

    @classmethod
    def _build(cls, cu: Tensor, lengths: tuple[int, ...], device: torch.device) -> "PackedDocuments":
        num_tokens = sum(lengths)
        starts = torch.repeat_interleave(
            cu[:-1].to(torch.int64), torch.tensor(lengths, device=device), output_size=num_tokens
        )
        position_ids = torch.arange(num_tokens, device=device, dtype=torch.int64) - starts
        return cls(cu_seqlens=cu, lengths=lengths, position_ids=position_ids)
