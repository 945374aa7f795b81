"""The bytes this rank sends, per collective kind and link, counted from the collectives it actually issues.

:class:`CollectiveMeter` is a ``TorchDispatchMode``: every collective of torch.distributed reaches the dispatcher
as one of c10d's ops (``c10d::_allgather_base_``, ``_reduce_scatter_base_``, ``allreduce_``, ``alltoall_base_``
and their list and coalesced forms: what ``dist.all_gather_single`` / ``all_gather_into_tensor``,
``reduce_scatter_single`` / ``reduce_scatter_tensor``, ``all_reduce`` and ``all_to_all_single`` call in
torch 2.11 to 2.14, FSDP2's included), or of the functional collectives (``_c10d_functional::all_reduce`` and
the others, which DTensor issues, e.g. for the gradient norm). The mode sees each once: inside a mode's handler
the mode is off, so the c10d op that a functional collective runs is not counted again. Ops on DTensors are
handed back (``NotImplemented``) so that DTensor runs them and the mode sees the collectives it issues on local
tensors. The group of each collective comes from its process group (its global ranks), the bytes from the
tensors' sizes, and the link split from :mod:`xtrain.parallel.comm_volume`, the convention the planner counts
with. Nothing is read from the device: sizes only.

Collectives of other kinds (broadcast, barrier, point-to-point) are not counted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from xtrain.parallel.comm_volume import (
    KINDS,
    NOTHING,
    LinkBytes,
    all_gather_bytes,
    all_reduce_bytes,
    all_to_all_bytes,
    reduce_scatter_bytes,
)

_NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd")
# Op name (namespace and trailing underscore dropped) -> its kind.
_KIND_OF = {
    "allgather": "all_gather",
    "_allgather_base": "all_gather",
    "allgather_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_out": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_out": "reduce_scatter",
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
}
# The argument holding what this rank contributes, by its name in the op's schema.
_INPUTS = ("input_tensor", "input_tensors", "input_list", "inputs", "input", "tensors")
_SIZED: dict[str, Callable[[int, Sequence[int], int, int], LinkBytes]] = {
    "all_gather": all_gather_bytes,
    "reduce_scatter": reduce_scatter_bytes,
    "all_reduce": all_reduce_bytes,
}


class CollectiveMeter(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves the mode untyped
    """``with CollectiveMeter(processes_per_node) as meter:`` counts this rank's collectives; ``meter.sent`` is
    the bytes sent per kind (every kind of :data:`~xtrain.parallel.comm_volume.KINDS`)."""

    def __init__(self, processes_per_node: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch leaves the mode untyped
        self.processes_per_node = processes_per_node
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.sent: dict[str, LinkBytes] = dict.fromkeys(KINDS, NOTHING)
        self._lock = threading.Lock()  # on CUDA the backward runs on autograd's device thread
        self._ranks: dict[str, list[int]] = {}

    def __torch_dispatch__(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if any(issubclass(kind, DTensor) for kind in types):
            return NotImplemented  # DTensor runs it; its collectives on local tensors come back here
        if func.namespace in _NAMESPACES:
            kind = _KIND_OF.get(func._schema.name.split("::")[-1].removesuffix("_"))
            if kind is not None:
                self._count(kind, func, args, kwargs)
        return func(*args, **kwargs)

    def _count(self, kind: str, func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        named = dict(zip((argument.name for argument in func._schema.arguments), args, strict=False))
        named.update(kwargs)
        group = self._group_ranks(named.get("process_group", named.get("group_name")))
        if group is None:
            return
        inputs = next(named[name] for name in _INPUTS if name in named)
        if kind == "all_to_all":
            sent = all_to_all_bytes(_bytes_to(inputs, named, len(group)), group, self.rank, self.processes_per_node)
        else:
            sent = _SIZED[kind](_nbytes(inputs), group, self.rank, self.processes_per_node)
        with self._lock:
            self.sent[kind] = self.sent[kind] + sent

    def _group_ranks(self, group: Any) -> list[int] | None:
        """The global ranks of a collective's group (a ProcessGroup, its TorchScript box, or its name)."""
        if isinstance(group, str):
            group = dist.distributed_c10d._resolve_process_group(group)  # type: ignore[attr-defined,arg-type]  # funcol's group name
        elif group is not None and not isinstance(group, dist.ProcessGroup):
            group = dist.ProcessGroup.unbox(group)
        if group is None:
            return None
        key = group.group_name
        if key not in self._ranks:
            self._ranks[key] = dist.get_process_group_ranks(group)
        return self._ranks[key]


def _nbytes(value: Any) -> int:
    """Bytes of a tensor, or of every tensor in a (nested) list of them."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(item) for item in value)
    return 0


def _bytes_to(inputs: Any, named: dict[str, Any], ranks: int) -> list[int]:
    """Bytes an all-to-all sends to each rank of its group, in group order."""
    if isinstance(inputs, (list, tuple)):  # alltoall_: one tensor per destination
        return [_nbytes(tensor) for tensor in inputs]
    splits = list(named.get("input_split_sizes") or [])
    rows = inputs.shape[0] if inputs.dim() else 1
    if not splits:  # equal splits
        splits = [rows // ranks] * ranks
    row_bytes = _nbytes(inputs) // rows if rows else 0
    return [int(split) * row_bytes for split in splits]
