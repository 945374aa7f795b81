"""Expert parallelism applied from outside: each rank of an ep group holds E/ep experts, and the token rows go to
the ranks that hold their experts and back through all-to-all (dropless, uneven split sizes).

Legend: T tokens of this rank, D hidden size, E experts, G = ep_size ranks of the ep group, L = E/G local experts,
K routed experts per token, S token-expert slots this rank sends (of one slice), R rows it receives.

What ``apply_expert_parallel`` does to the module tree: every ``MoEBlock``'s expert parameters become DTensors
sharded on the expert dimension over the ep mesh (``Shard(0)``: ep rank g holds experts [g*L, (g+1)*L)), with
their global shapes, so checkpoints keep one layout whatever ep_size; and the block's ``expert_schedule`` is set to
an :class:`ExpertParallelSchedule`. Apply it to the model built on the meta device, first: before activation
checkpointing, compile and FSDP (torchtitan's order); ``apply_fsdp(..., expert_mesh=...)`` then shards the expert
parameters over the ranks that hold the same experts.

The schedule of one MoE layer (Domino-EP with ``domino_slices`` = N; N = 1 is plain EP):

1. route all T tokens (the router statistics are this rank's tokens, as without EP);
2. split the tokens into N contiguous slices; per slice, sort its slots by expert and count rows per expert;
3. exchange the counts of every slice in one small all-to-all, then read them on the host: the layer's only host
   synchronisation (see ``all_to_all``);
4. launch every slice's dispatch (rows and their routing weight as one extra column) asynchronously;
5. run the shared experts while the dispatches are in flight;
6. in one call of the experts module (so FSDP gathers and reduces its parameters once): for each slice, wait for
   its rows, sort them by local expert, compute, unsort, launch its combine: slice i's experts run while slice
   i+1's dispatch and slice i-1's combine are in flight;
7. wait for each combine and sum each token's K rows, in the order the single-device block sums them.

In backward, autograd's ready queue gives the mirror image: each slice's gradient all-to-all is launched by one
node and waited by another, and the other slices' expert backward runs in between. The slices change no number
beyond rounding: the router sees all tokens at once, each row meets the same expert weights, and each token's K
rows are summed in the same order.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from deeptrace.collect import Collector
from deeptrace.spans import Category
from torch import Tensor, nn
from torch.distributed.tensor import Shard, distribute_tensor

from xtrain.errors import ConfigError
from xtrain.model.moe import MoEBlock
from xtrain.model.moe.block import count_tokens_per_expert
from xtrain.model.moe.experts import ExpertRows
from xtrain.model.moe.permute import SlotLayout, combine_rows, dispatch_rows, permute_slots
from xtrain.model.moe.router import Routing
from xtrain.parallel.all_to_all import CommObserver, Exchange, exchange_counts, finish_exchange, start_exchange
from xtrain.parallel.mesh import ExpertParallelMesh


class ExchangeSpans:
    """A :class:`CommObserver` that records every exchange as a deeptrace COMM span (group ``ep``), on one track
    per exchange name and direction kind (``ep-comm/<n>``: spans on one track never overlap), so that ``deeptrace
    analyze`` counts the all-to-alls and how much of them compute hid. Called from gloo's or NCCL's completion
    threads: a tuple appended per exchange, nothing more."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self._lanes: dict[str, int] = {}
        self._lock = threading.Lock()

    def exchanged(self, name: str, launch_ns: int, done_ns: int, nbytes: int) -> None:
        with self._lock:
            lane = self._lanes.setdefault(name.removesuffix(" backward"), len(self._lanes))
        self.collector.record(
            f"all_to_all {name}", Category.COMM, launch_ns, done_ns, nbytes=nbytes, group="ep", track=f"ep-comm/{lane}"
        )

    def waited(self, name: str, start_ns: int, end_ns: int) -> None:
        """Waits are the compute thread's time; the trainer's own spans cover it."""


def moe_blocks(model: nn.Module) -> list[MoEBlock]:
    """Every MoE block of ``model``, in module order (wrappers such as checkpointing or compile included)."""
    return [module for module in model.modules() if isinstance(module, MoEBlock)]


def received_rows(model: nn.Module) -> list[int] | None:
    """Rows each MoE block's experts received in its last forward, in module order (None without expert
    parallelism)."""
    schedules = [b.expert_schedule for b in moe_blocks(model) if isinstance(b.expert_schedule, ExpertParallelSchedule)]
    return [schedule.received_rows for schedule in schedules] or None


def apply_expert_parallel(
    model: nn.Module, mesh: ExpertParallelMesh, *, domino_slices: int = 1, observer: CommObserver | None = None
) -> list[MoEBlock]:
    """Split every MoE block's experts over ``mesh.experts`` and install the all-to-all schedule, in place;
    returns the blocks. ``observer`` is told of every exchange (tracing, the benchmark)."""
    if domino_slices < 1:
        raise ConfigError(f"parallel.domino_slices = {domino_slices} must be at least 1 (1 turns slicing off)")
    blocks = moe_blocks(model)
    ep_size = mesh.ep_size
    for block in blocks:
        if block.config.num_experts % ep_size:
            raise ConfigError(
                f"parallel.ep_size = {ep_size} must divide the number of experts {block.config.num_experts}"
            )
        for name, param in list(block.experts.named_parameters(recurse=False)):
            # src_data_rank=None: every rank slices its own part, no communication (the model is usually on the
            # meta device here; real values come later from materialisation or a checkpoint).
            local = distribute_tensor(param.data, mesh.experts, [Shard(0)], src_data_rank=None)
            setattr(block.experts, name, nn.Parameter(local, requires_grad=param.requires_grad))
        block.expert_schedule = ExpertParallelSchedule(
            group=mesh.experts.get_group(), ep_size=ep_size, slices=domino_slices, observer=observer
        )
    return blocks


@dataclass(frozen=True)
class _Slice:
    """One slice's part of the layer: its tokens, where its slots go, and its exchanges."""

    start: int
    stop: int
    layout: SlotLayout
    dispatch: Exchange
    combine: Exchange
    recv_counts_GL: Tensor  # noqa: N815 (shape suffix, see the legend)


class ExpertParallelSchedule:
    """The MoE block's routed and shared experts over an ep group (see the module docstring for the order)."""

    def __init__(
        self, *, group: dist.ProcessGroup, ep_size: int, slices: int = 1, observer: CommObserver | None = None
    ) -> None:
        self.group = group
        self.ep_size = ep_size
        self.slices = slices
        self.observer = observer
        self.received_rows = 0
        """Rows this rank's experts received in the layer's last call (every slice, every sender): the routing
        that the layer's memory depends on, read by ``trace.memory`` (:func:`received_rows`)."""

    # Host-side split sizes and collectives: kept out of compiled graphs.
    @torch.compiler.disable  # type: ignore[untyped-decorator]  # torch leaves it untyped
    def __call__(self, block: MoEBlock, x_TD: Tensor, routing: Routing) -> Tensor:
        num_experts, g = block.config.num_experts, self.ep_size
        local = num_experts // g
        parts = self._plan(x_TD.shape[0], routing, num_experts)
        # [G, N, L]: what this rank sends each ep rank, per slice and local expert of the receiver.
        send_counts_GNL = torch.stack([counts_E.view(g, local) for _, counts_E in parts], dim=1).contiguous()
        recv_counts_GNL = exchange_counts(send_counts_GNL, self.group, self.observer)
        # The one host synchronisation of the layer: every slice's split sizes at once.
        sizes = torch.stack([send_counts_GNL.sum(-1), recv_counts_GNL.sum(-1)]).tolist()
        self.received_rows = sum(map(sum, sizes[1]))
        slices: list[_Slice] = []
        pending: list[Tensor] = []
        for index, ((start, stop, layout, weight_S1), _) in enumerate(parts):
            send_splits = [sizes[0][rank][index] for rank in range(g)]
            recv_splits = [sizes[1][rank][index] for rank in range(g)]
            label = f"slice {index}"
            part = _Slice(
                start,
                stop,
                layout,
                Exchange(send_splits, recv_splits, self.group, f"dispatch {label}", self.observer),
                Exchange(recv_splits, send_splits, self.group, f"combine {label}", self.observer),
                recv_counts_GNL[:, index, :],
            )
            x_SD = dispatch_rows(x_TD[start:stop], layout)
            # The routing weight travels as one more column: one exchange, and its gradient comes back with x's.
            pending.append(start_exchange(torch.cat([x_SD, weight_S1.to(x_SD.dtype)], dim=1), part.dispatch))
            slices.append(part)
        shared_TD = block.shared_experts(x_TD) if block.shared_experts is not None else None  # overlaps dispatch
        orders: dict[int, tuple[Tensor, Tensor]] = {}
        hidden = x_TD.shape[1]

        def arrive(index: int, buffer: Tensor) -> ExpertRows:
            part = slices[index]
            rows_RC = finish_exchange(buffer, part.dispatch)
            # Rows arrive grouped by sender, each sender's sorted by expert: sort them by local expert (stable).
            expert_R = torch.repeat_interleave(
                torch.arange(local, device=rows_RC.device).repeat(g),
                part.recv_counts_GL.reshape(-1),
                output_size=rows_RC.shape[0],
            )
            order_R = torch.argsort(expert_R, stable=True)
            inverse_R = torch.empty_like(order_R)
            inverse_R[order_R] = torch.arange(order_R.numel(), device=order_R.device)
            orders[index] = (order_R, inverse_R)
            # Gathering the two column ranges separately gives dense rows (the grouped matmul needs aligned
            # strides) with no copy beyond the sort itself.
            x_RD = rows_RC[:, :hidden].index_select(0, order_R)
            weight_R1 = rows_RC[:, hidden:].index_select(0, order_R)
            return x_RD, weight_R1, part.recv_counts_GL.sum(dim=0)

        def depart(index: int, out_RD: Tensor) -> Tensor:
            _, inverse_R = orders.pop(index)
            return start_exchange(out_RD.index_select(0, inverse_R), slices[index].combine)

        returned = block.experts.forward_slices(pending, arrive, depart)
        pieces = [
            combine_rows(finish_exchange(buffer, part.combine), part.layout)
            for buffer, part in zip(returned, slices, strict=True)
        ]
        routed_TD = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=0)
        return routed_TD if shared_TD is None else routed_TD + shared_TD

    def _plan(
        self, num_tokens: int, routing: Routing, num_experts: int
    ) -> Sequence[tuple[tuple[int, int, SlotLayout, Tensor], Tensor]]:
        """Per slice: (start, stop, slot layout, weight_S1) and its rows per expert [E]."""
        # Always `slices` slices, empty ones included: every rank of the group must run the same exchanges.
        count = self.slices
        bounds = [num_tokens * i // count for i in range(count + 1)]
        plan = []
        for start, stop in itertools.pairwise(bounds):
            experts_TK, weights_TK = routing.experts[start:stop], routing.weights[start:stop]
            layout, weight_S1 = permute_slots(experts_TK, weights_TK)
            plan.append(((start, stop, layout, weight_S1), count_tokens_per_expert(experts_TK, num_experts)))
        return plan
