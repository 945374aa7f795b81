"""Rows exchanged between the ranks of a group with uneven split sizes: asynchronous, differentiable, dropless.

Legend: R rows, C columns. ``send_splits[r]`` rows of the send buffer go to rank r, in rank order;
``recv_splits[r]`` rows arrive from rank r. Nothing is padded and nothing dropped: a split may be 0, and so may a
whole buffer (a rank that sends or receives no row takes part all the same).

Host synchronisation: the split sizes are Python ints, which ``all_to_all_single`` needs on the host. They are
exchanged once per MoE layer and forward by :func:`exchange_counts` (one small all-to-all of counts, then one
device-to-host copy in the caller's ``tolist``): that is the only synchronisation. The backward exchanges
gradients with the same sizes reversed, known from the forward, so it needs none; the permutations around the
exchange stay on the device.

An exchange is two autograd nodes, started and waited separately so that compute can run in between:
``start_exchange`` launches the all-to-all and returns its (not yet filled) output buffer; ``finish_exchange``
waits for it. In backward the order reverses: the gradient's all-to-all is launched by the finishing node's
backward and waited by the starting node's backward, and autograd runs other ready work (another slice's
experts) in between.

Activation checkpointing (see :class:`ExchangeTape`): inside a checkpointed layer's forward every received buffer
is kept on a tape, and the layer's recompute in backward takes its exchanges from the tape instead of
communicating: the recompute runs no collective at all (and no rank waits for another during it).

Where it runs: on CUDA the all-to-all is issued on a side stream (one per device), which first waits for the
compute stream (the send rows are written there) and records an event when the exchange is complete; waiting
makes the compute stream wait for that event, so the host never blocks. The buffers are marked as used on the
side stream (``record_stream``) so the allocator does not reuse them early. On the CPU, gloo runs the
collective on its own threads and waiting blocks the calling thread until it is done.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor


class CommObserver(Protocol):
    """Told of every exchange (tracing, the benchmark); times are ``time.monotonic_ns()``."""

    def exchanged(self, name: str, launch_ns: int, done_ns: int, nbytes: int) -> None:
        """An exchange completed (called from a communication thread)."""

    def waited(self, name: str, start_ns: int, end_ns: int) -> None:
        """The calling thread waited for an exchange from start_ns to end_ns."""


class ExchangeTape:
    """The buffers one checkpointed layer received in its forward, in launch order, which its recompute replays.

    Recomputing a layer repeats its forward exactly (the routing is saved, so the split sizes are the same), so
    the recompute's n-th exchange is the forward's n-th. What the tape holds are the receive buffers themselves
    (no copy), alive until the layer's backward has used them: per MoE layer and micro-batch the counts, the
    dispatched rows with their weight column ([R, D+1], R the rows this rank's experts got) and the combined rows
    ([T·K, D]). The gradient exchanges of backward are not taped: they run in backward, outside the recompute."""

    def __init__(self) -> None:
        self.received: list[Tensor] = []
        self.replayed = 0

    def replay(self, rows: int, columns: tuple[int, ...], name: str) -> Tensor:
        if self.replayed >= len(self.received):
            raise RuntimeError(f"recompute of a checkpointed layer made more exchanges than its forward ({name})")
        buffer = self.received[self.replayed]
        self.replayed += 1
        if tuple(buffer.shape) != (rows, *columns):
            raise RuntimeError(
                f"recompute of a checkpointed layer exchanged {name} with shape {[rows, *columns]}, its forward "
                f"{list(buffer.shape)}: the recompute did not repeat the forward"
            )
        return buffer.detach()  # a new tensor object: the recompute's graph must not touch the forward's


class _TapeMode:
    """``with`` this: the exchanges launched by this thread are recorded on ``tape`` (or replayed from it)."""

    def __init__(self, tape: ExchangeTape, *, replay: bool) -> None:
        self.tape = tape
        self.replay = replay

    def __enter__(self) -> None:
        _tape_modes().append(self)

    def __exit__(self, *_exc: object) -> None:
        _tape_modes().remove(self)


_THREAD = threading.local()


def _tape_modes() -> list[_TapeMode]:
    # Per thread: the recompute runs on the backward thread, which on CUDA is not the one that ran forward.
    if not hasattr(_THREAD, "modes"):
        _THREAD.modes = []
    modes: list[_TapeMode] = _THREAD.modes
    return modes


def recording(tape: ExchangeTape) -> _TapeMode:
    """A context in which this thread's exchanges keep their receive buffers on ``tape`` (a checkpointed forward)."""
    return _TapeMode(tape, replay=False)


def replaying(tape: ExchangeTape) -> _TapeMode:
    """A context in which this thread's exchanges come from ``tape``, with no communication (the recompute)."""
    return _TapeMode(tape, replay=True)


_SIDE_STREAMS: dict[torch.device, Any] = {}


def _side_stream(device: torch.device) -> Any:
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]  # torch leaves it untyped
    return _SIDE_STREAMS[device]


@dataclass
class InFlight:
    """One all-to-all launched and not yet waited for."""

    work: Any
    """The collective's Work (None: replayed from a tape, nothing to wait for)."""
    done: Any = None
    """CUDA event recorded on the side stream after the exchange (None on the CPU)."""
    name: str = "all_to_all"
    observer: CommObserver | None = None

    def wait(self) -> None:
        if self.work is None:
            return
        start_ns = time.monotonic_ns()
        if self.done is not None:
            torch.cuda.current_stream().wait_event(self.done)
        else:
            self.work.wait()
        if self.observer is not None:
            self.observer.waited(self.name, start_ns, time.monotonic_ns())


def launch(
    send_RC: Tensor,
    send_splits: list[int],
    recv_splits: list[int],
    group: dist.ProcessGroup,
    *,
    name: str = "all_to_all",
    observer: CommObserver | None = None,
) -> tuple[Tensor, InFlight]:
    """Start the exchange of ``send_RC``'s rows; returns the receive buffer (valid once waited) and the handle.
    Inside :func:`replaying` the buffer comes from the tape and nothing is sent."""
    modes = _tape_modes()
    tape_mode = modes[-1] if modes else None
    if tape_mode is not None and tape_mode.replay:
        return tape_mode.tape.replay(sum(recv_splits), tuple(send_RC.shape[1:]), name), InFlight(None, None, name)
    send_RC = send_RC.contiguous()
    recv_RC = send_RC.new_empty(sum(recv_splits), *send_RC.shape[1:])
    if tape_mode is not None:
        # The same storage, filled once waited (detached: the tape must not hold the forward graph alive).
        tape_mode.tape.received.append(recv_RC.detach())
    launched_ns = time.monotonic_ns()
    if send_RC.is_cuda:
        side = _side_stream(send_RC.device)
        side.wait_stream(torch.cuda.current_stream(send_RC.device))
        with torch.cuda.stream(side):
            work = dist.all_to_all_single(recv_RC, send_RC, recv_splits, send_splits, group=group, async_op=True)
            assert work is not None
            work.wait()  # the side stream (not the host) waits for the communication
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch leaves it untyped
            done.record(side)
        send_RC.record_stream(side)
        recv_RC.record_stream(side)
        flight = InFlight(work, done, name, observer)
    else:
        work = dist.all_to_all_single(recv_RC, send_RC, recv_splits, send_splits, group=group, async_op=True)
        flight = InFlight(work, None, name, observer)
    if observer is not None:
        nbytes = send_RC.numel() * send_RC.element_size()
        flight.work.get_future().add_done_callback(
            lambda _: observer.exchanged(name, launched_ns, time.monotonic_ns(), nbytes)
        )
    return recv_RC, flight


def exchange_counts(send_counts: Tensor, group: dist.ProcessGroup, observer: CommObserver | None = None) -> Tensor:
    """Counts [G, ...] (row g for rank g) -> the counts every rank sends here, [G, ...], on the device (blocking:
    the caller needs them on the host right after)."""
    ones = [1] * send_counts.shape[0]
    recv, flight = launch(send_counts, ones, ones, group, name="split sizes", observer=observer)
    flight.wait()
    return recv.view_as(send_counts)


@dataclass
class Exchange:
    """The state one differentiable exchange shares between its starting and its finishing node."""

    send_splits: list[int]
    recv_splits: list[int]
    group: dist.ProcessGroup
    name: str
    observer: CommObserver | None = None
    forward: InFlight | None = None
    backward: InFlight | None = None
    grad_send: Tensor | None = None


class _Start(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, send_RC: Tensor, exchange: Exchange) -> Tensor:
        ctx.exchange = exchange
        recv, exchange.forward = launch(
            send_RC, exchange.send_splits, exchange.recv_splits, exchange.group,
            name=exchange.name, observer=exchange.observer,
        )  # fmt: skip
        return recv

    @staticmethod
    def backward(ctx: Any, _carrier: Tensor) -> Any:
        # The gradient of the send rows is what the finishing node's backward launched; the incoming gradient
        # only carries autograd's ordering (it is the received rows' gradient, being sent).
        exchange: Exchange = ctx.exchange
        assert exchange.backward is not None and exchange.grad_send is not None, "no gradient exchange launched"
        exchange.backward.wait()
        grad_send = exchange.grad_send
        exchange.backward = exchange.grad_send = None
        return grad_send, None


class _Finish(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, recv_RC: Tensor, exchange: Exchange) -> Tensor:
        ctx.exchange = exchange
        assert exchange.forward is not None, "finish_exchange before start_exchange"
        exchange.forward.wait()
        exchange.forward = None
        return recv_RC.view_as(recv_RC)

    @staticmethod
    def backward(ctx: Any, grad_recv_RC: Tensor) -> Any:
        exchange: Exchange = ctx.exchange
        # Reversed sizes: each rank sends back the gradient of the rows it received.
        exchange.grad_send, exchange.backward = launch(
            grad_recv_RC, exchange.recv_splits, exchange.send_splits, exchange.group,
            name=f"{exchange.name} backward", observer=exchange.observer,
        )  # fmt: skip
        return grad_recv_RC, None


def start_exchange(send_RC: Tensor, exchange: Exchange) -> Tensor:
    """Launch the exchange (differentiable); the returned buffer must go through :func:`finish_exchange` before
    anything reads it."""
    recv: Tensor = _Start.apply(send_RC, exchange)  # type: ignore[no-untyped-call]  # Function.apply is untyped
    return recv


def finish_exchange(recv_RC: Tensor, exchange: Exchange) -> Tensor:
    """Wait for the exchange ``recv_RC`` came from; returns the received rows (differentiable)."""
    rows: Tensor = _Finish.apply(recv_RC, exchange)  # type: ignore[no-untyped-call]  # Function.apply is untyped
    return rows
