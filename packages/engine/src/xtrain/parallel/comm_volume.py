"""How many bytes a rank sends in one collective, split into the links inside its node and those between nodes:
the one convention that the planner (:mod:`xtrain.plan.comm`, from the model and the layout) and the trainer's
measurement (:mod:`xtrain.parallel.comm_meter`, from the collectives torch.distributed issues) both count with.

The convention: a collective's bytes are what the algorithm sends from this rank, attributed to the peer each
piece is *for*; a piece for a peer on this rank's node is ``intra``, one for a peer on another node ``inter``
(rank r is on node ``r // processes_per_node``: torchrun gives every node the same number of consecutive ranks).
With n ranks in the group and p of its other ranks on this node (q = n - 1 - p on other nodes):

- **all-gather** of an input of s bytes per rank (ring): every other rank needs this rank's s bytes, so
  (n - 1)·s in all, p·s intra and q·s inter;
- **reduce-scatter** of an input of S bytes per rank (ring): every other rank gets this rank's contribution to
  its chunk, S / n bytes, so (n - 1)/n·S in all, p·S/n intra, q·S/n inter;
- **all-reduce** of S bytes (ring: a reduce-scatter, then an all-gather of the reduced chunks): 2(n - 1)/n·S in
  all, 2p·S/n intra, 2q·S/n inter (each part rounded down to whole bytes);
- **all-to-all**: the rows this rank sends to the other ranks, by the node of each destination; what it sends to
  itself is a local copy and is not counted.

A group of one rank sends nothing. The split by destination is the algorithm's data, not NCCL's wiring: a ring
that crosses a node boundary carries q/(n-1) of a rank's traffic over the boundary on average, which is what the
split says; hierarchical algorithms move the same bytes per destination.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
"""The collective kinds counted, in the order they are reported."""


@dataclass(frozen=True)
class LinkBytes:
    intra: int
    """Bytes this rank sends to ranks on its own node."""
    inter: int
    """Bytes this rank sends to ranks on other nodes."""

    def __add__(self, other: LinkBytes) -> LinkBytes:
        return LinkBytes(self.intra + other.intra, self.inter + other.inter)

    def __mul__(self, times: int) -> LinkBytes:
        return LinkBytes(self.intra * times, self.inter * times)

    @property
    def total(self) -> int:
        return self.intra + self.inter


NOTHING = LinkBytes(0, 0)


def node_of(rank: int, processes_per_node: int) -> int:
    return rank // processes_per_node


def peers(group_ranks: Sequence[int], rank: int, processes_per_node: int) -> tuple[int, int]:
    """(the group's other ranks on ``rank``'s node, those on other nodes); ``group_ranks`` are global ranks.

    A ``range`` (the planner's groups: consecutive or strided ranks) is counted in closed form, any other
    sequence rank by rank; both give the same counts."""
    node = node_of(rank, processes_per_node)
    if isinstance(group_ranks, range):
        first, last = node * processes_per_node, (node + 1) * processes_per_node  # the node's ranks [first, last)
        same = _in_interval(group_ranks, first, last) - (rank in group_ranks)
    else:
        same = sum(1 for other in group_ranks if other != rank and node_of(other, processes_per_node) == node)
    return same, len(group_ranks) - 1 - same


def _in_interval(ranks: range, first: int, last: int) -> int:
    """How many of ``ranks`` lie in [first, last)."""
    if ranks.step < 0:
        ranks = ranks[::-1]
    start, step = ranks.start, ranks.step

    def index(bound: int) -> int:  # the first index whose rank is >= bound, within [0, len]
        return min(len(ranks), max(0, -((start - bound) // step)))

    return max(0, index(last) - index(first))


def all_gather_bytes(input_bytes: int, group_ranks: Sequence[int], rank: int, processes_per_node: int) -> LinkBytes:
    """An all-gather in which every rank contributes ``input_bytes``."""
    same, other = peers(group_ranks, rank, processes_per_node)
    return LinkBytes(same * input_bytes, other * input_bytes)


def reduce_scatter_bytes(input_bytes: int, group_ranks: Sequence[int], rank: int, processes_per_node: int) -> LinkBytes:
    """A reduce-scatter of ``input_bytes`` per rank (n chunks of ``input_bytes / n``)."""
    same, other = peers(group_ranks, rank, processes_per_node)
    n = len(group_ranks)
    return LinkBytes(same * input_bytes // n, other * input_bytes // n)


def all_reduce_bytes(nbytes: int, group_ranks: Sequence[int], rank: int, processes_per_node: int) -> LinkBytes:
    """An all-reduce of ``nbytes``."""
    same, other = peers(group_ranks, rank, processes_per_node)
    n = len(group_ranks)
    return LinkBytes(2 * same * nbytes // n, 2 * other * nbytes // n)


def all_to_all_bytes(
    bytes_to: Sequence[int], group_ranks: Sequence[int], rank: int, processes_per_node: int
) -> LinkBytes:
    """An all-to-all in which this rank sends ``bytes_to[i]`` to ``group_ranks[i]``."""
    node = node_of(rank, processes_per_node)
    intra = inter = 0
    for other, nbytes in zip(group_ranks, bytes_to, strict=True):
        if other == rank:
            continue
        if node_of(other, processes_per_node) == node:
            intra += nbytes
        else:
            inter += nbytes
    return LinkBytes(intra, inter)


def uniform_all_to_all_bytes(
    bytes_each: int, group_ranks: Sequence[int], rank: int, processes_per_node: int
) -> LinkBytes:
    """An all-to-all in which this rank sends ``bytes_each`` to every rank of the group: the same as
    :func:`all_to_all_bytes` with ``[bytes_each] * len(group_ranks)``."""
    same, other = peers(group_ranks, rank, processes_per_node)
    return LinkBytes(same * bytes_each, other * bytes_each)


def total_by_kind(parts: dict[str, LinkBytes]) -> dict[str, LinkBytes]:
    """Every kind of :data:`KINDS`, in order, the ones without bytes as zero."""
    return {kind: parts.get(kind, NOTHING) for kind in KINDS}
