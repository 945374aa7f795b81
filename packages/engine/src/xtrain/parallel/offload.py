"""Activation offload: the recompute checkpoints of checkpointed layers move to host memory during forward and
come back one layer ahead during backward.

With checkpointing, what a layer keeps between forward and backward is its checkpoint: its inputs (the hidden
states entering the layer; [T, D] per layer, so 64k tokens × 7168 × bf16 = 0.9 GiB per layer of a DeepSeek-V3-sized
model). Offloading moves them to host memory, so the device holds the checkpoints of at most
``resident_layers`` layers at once, whatever the depth.

How (see :class:`ActivationOffloader`):

- The non-reentrant checkpoint saves a layer's inputs through autograd's saved-tensor hooks *before* it installs
  its own hooks for the layer's intermediates; running the checkpoint inside our own
  ``saved_tensors_hooks`` therefore sees exactly the checkpoint, nothing else.
- Forward (pack hook): a tensor that requires grad (the hidden states; the position tables and document
  boundaries are shared by every layer and stay where they are) is copied into a host buffer from a pool
  (pinned on CUDA, reused from step to step) on a side stream that first waits for the compute stream, so the
  copy overlaps the next layers' compute; an event marks its end. The device tensor is held until that event,
  and at most ``resident_layers`` layers' copies are in flight (the oldest is waited for). The top checkpointed
  layer is not offloaded at all: backward needs it first, right away.
- Backward (unpack hook): layer i's checkpoint comes back; if it was prefetched, the compute stream waits for the
  prefetch's event and the tensor is marked as used by the compute stream (``record_stream``) so the allocator does
  not hand its memory out early. Then the next checkpoints backward will ask for (layers below i) are prefetched
  on the side stream, as many as the residency bound allows (one layer ahead with the default of 2).
- On CPU the same code runs with synchronous copies into a separate buffer pool (there are no streams); the order
  of offloads, prefetches and restores, and the residency accounting, are the same, which is what the tests check.

Host buffers stay assigned to their checkpoint until the next forward begins (a second backward over the same
graph can restore again), then go back to the pool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from xtrain.errors import ConfigError
from xtrain.model.transformer import Transformer
from xtrain.parallel.checkpointing import checkpoint_layer, checkpointed_wrappers, set_checkpoint_fn


def apply_activation_offload(model: Transformer, device: torch.device, resident_layers: int = 2) -> ActivationOffloader:
    """Make every checkpointed layer of ``model`` offload its checkpoint to host memory from ``device`` (after
    ``apply_activation_checkpointing``, before compile and FSDP); returns the offloader (its log and counters)."""
    wrappers = checkpointed_wrappers(model)
    if not wrappers:
        raise ConfigError("memory.offload needs checkpointed layers: set memory.checkpointing to something but none")
    offloader = ActivationOffloader([index for index, _ in wrappers], device, resident_layers=resident_layers)
    for index, wrapper in wrappers:
        set_checkpoint_fn(wrapper, offloader.checkpoint_fn(index))
    return offloader


def offloaded_layer(layer: torch.nn.Module) -> torch.nn.Module | None:
    """The decoder layer inside ``layer`` when ``layer`` is a checkpoint wrapper that offloads, else None."""
    function = getattr(layer, "checkpoint_fn", None)
    return layer._checkpoint_wrapped_module if getattr(function, _OFFLOADS, False) else None  # type: ignore[return-value]


_OFFLOADS = "offloads_activations"


class HostBufferPool:
    """Host tensors reused across steps, by shape and dtype (pinned when the device is a GPU: pinning is slow, so
    it happens once per buffer, not once per step; outside PyTorch's allocator on a CPU-only run)."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self._free: dict[tuple[tuple[int, ...], torch.dtype], list[tuple[torch.Tensor, Any]]] = {}
        self.allocated = 0

    def take(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        free = self._free.get((tuple(shape), dtype))
        if free:
            buffer, last_use = free.pop()
            if last_use is not None:
                last_use.synchronize()  # a copy back to the device may still read it
            return buffer
        self.allocated += 1
        if self.pin:
            return torch.empty(shape, dtype=dtype, device="cpu", pin_memory=True)
        # On a CPU-only run the "device" is host memory too: these buffers come from outside PyTorch's allocator
        # (a Python bytearray), so what the allocator holds is what the device would hold (the benchmark counts it).
        nbytes = max(1, torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        return torch.frombuffer(bytearray(nbytes), dtype=dtype)[: torch.Size(shape).numel()].view(shape)

    def give(self, buffer: torch.Tensor, last_use: Any = None) -> None:
        self._free.setdefault((tuple(buffer.shape), buffer.dtype), []).append((buffer, last_use))


@dataclass
class _Checkpoint:
    """One saved tensor of one layer's checkpoint."""

    layer: int
    host: torch.Tensor | None
    """The host copy (None for the top layer, which stays on the device)."""
    device_copy: torch.Tensor | None
    """On the device: the original while its offload is in flight, or the prefetched/restored copy."""
    ready: Any = None
    """CUDA event: the offload (forward) or the prefetch (backward) has finished."""
    host_read: Any = None
    """CUDA event: the last copy back to the device has finished reading the host buffer."""


@dataclass
class _Pass:
    """The checkpoints of one forward (one micro-batch), consumed by its backward."""

    saved: dict[int, list[_Checkpoint]] = field(default_factory=dict)
    last_packed: int | None = None
    in_flight: list[int] = field(default_factory=list)
    """Layers whose offload copies may still run (forward), oldest first."""
    fetched: list[int] = field(default_factory=list)
    """Layers brought back in backward (prefetched or restored on demand), in that order."""
    current: int | None = None
    """The layer whose checkpoint autograd was given last (None: backward has not begun)."""
    done: bool = False
    """Its backward has finished: nothing is held on the device any more."""


class ActivationOffloader:
    """Moves the checkpoints of the layers ``layers`` (bottom to top) to host memory and back; see the module
    docstring. ``log`` records ("offload" | "keep" | "prefetch" | "restore", layer) of the current pass."""

    def __init__(self, layers: list[int], device: torch.device, *, resident_layers: int = 2) -> None:
        if resident_layers < 2:
            raise ConfigError(
                f"memory.offload_resident_layers must be at least 2 (the layer in backward and the one fetched "
                f"ahead of it), got {resident_layers}"
            )
        self.layers = sorted(layers)
        self.device = device
        self.resident_layers = resident_layers
        self.pool = HostBufferPool(pin=device.type == "cuda")
        self._stream: torch.cuda.Stream | None = None
        if device.type == "cuda":
            self._stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self._pass = _Pass()
        self.log: list[tuple[str, int]] = []
        self.peak_resident_layers = 0
        """Most layers whose checkpoints the mechanism held on the device at once, since creation."""
        self.offloaded_bytes = 0
        """Bytes copied to host memory in the current pass."""

    def checkpoint_fn(self, layer: int) -> Callable[..., Any]:
        """The checkpoint wrapper's function for ``layer``: the routing-saving checkpoint inside our hooks."""

        def run(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            with torch.autograd.graph.saved_tensors_hooks(lambda t: self._pack(layer, t), self._unpack):
                return checkpoint_layer(module, *args, **kwargs)

        setattr(run, _OFFLOADS, True)
        return run

    def resident_layers_now(self) -> int:
        """Layers whose checkpoints the mechanism holds on the device right now."""
        run = self._pass
        if run.done:
            return 0
        held = set(run.in_flight)
        if run.current is None:
            if self.layers[-1] in run.saved:
                held.add(self.layers[-1])  # the top layer is kept on the device until its backward
        else:
            held.add(run.current)
            held.update(layer for layer in run.fetched if layer < run.current)
        return len(held)

    # Forward.

    def _pack(self, layer: int, tensor: torch.Tensor) -> Any:
        if not tensor.requires_grad or tensor.numel() == 0:
            # The checkpoint's empty marker, or shared by all layers (positions, document boundaries).
            return tensor
        run = self._pass
        new_forward = run.done or run.current is not None or run.last_packed not in (None, layer)
        if layer == self.layers[0] and new_forward:
            self._begin_pass()  # the next micro-batch's forward
            run = self._pass
        if layer == self.layers[-1]:
            entry = _Checkpoint(layer, host=None, device_copy=tensor)
            self._log_once("keep", layer)
        else:
            entry = self._offload(layer, tensor)
        run.saved.setdefault(layer, []).append(entry)
        run.last_packed = layer
        self._note_residency()
        return entry

    def _offload(self, layer: int, tensor: torch.Tensor) -> _Checkpoint:
        host = self.pool.take(tensor.shape, tensor.dtype)
        self.offloaded_bytes += tensor.numel() * tensor.element_size()
        self._log_once("offload", layer)
        if self._stream is None:  # CPU: the copy is synchronous, done before the device tensor is let go
            host.copy_(tensor.detach())
            return _Checkpoint(layer, host=host, device_copy=None)
        run = self._pass
        if layer not in run.in_flight:
            while len(run.in_flight) >= self.resident_layers - 1:  # room for this layer's copy
                self._finish_offload(run.in_flight.pop(0))
            run.in_flight.append(layer)
        entry = _Checkpoint(layer, host=host, device_copy=tensor)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))  # the tensor has been computed
        with torch.cuda.stream(self._stream):
            host.copy_(tensor.detach(), non_blocking=True)
            entry.ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            entry.ready.record(self._stream)
        return entry

    def _finish_offload(self, layer: int) -> None:
        for entry in self._pass.saved.get(layer, []):
            if entry.ready is not None:
                entry.ready.synchronize()
                entry.ready = None
            entry.device_copy = None  # the host copy is complete: the device memory may go

    # Backward.

    def _unpack(self, entry: Any) -> torch.Tensor:
        if not isinstance(entry, _Checkpoint):
            return entry  # type: ignore[no-any-return]  # a tensor _pack kept as it was
        run = self._pass
        if run.current is None:  # backward begins: every offload completes before a buffer is read back
            for layer in run.in_flight:
                self._finish_offload(layer)
            run.in_flight.clear()
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
        if entry.device_copy is None:
            if entry.host is None:
                raise RuntimeError(
                    f"layer {entry.layer}'s checkpoint was already used by a backward (offload supports one backward "
                    "per forward)"
                )
            self._copy_back(entry)
            if entry.layer not in run.fetched:
                run.fetched.append(entry.layer)
        if run.current != entry.layer:
            self._release(run.current)  # autograd already holds what it needs of the layer above
            run.current = entry.layer
            self.log.append(("restore", entry.layer))
        tensor = entry.device_copy
        assert tensor is not None
        if entry.ready is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(entry.ready)
            tensor.record_stream(stream)  # allocated on the side stream, now used by the compute stream
            entry.ready = None
        self._prefetch_below(entry.layer)
        self._note_residency()
        return tensor

    def _prefetch_below(self, layer: int) -> None:
        run = self._pass
        ahead = [fetched for fetched in run.fetched if fetched < layer]
        room = self.resident_layers - 1 - len(ahead)
        waiting = [below for below in reversed(self.layers) if below < layer and below not in run.fetched]
        for below in waiting[: max(room, 0)]:
            if below in run.saved:
                for entry in run.saved[below]:
                    self._copy_back(entry)
                run.fetched.append(below)
                self.log.append(("prefetch", below))

    def _copy_back(self, entry: _Checkpoint) -> None:
        host = entry.host
        assert host is not None
        if self._stream is None:
            entry.device_copy = host.clone()
            return
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            entry.device_copy = host.to(self.device, non_blocking=True)
            entry.ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            entry.ready.record(self._stream)
            entry.host_read = entry.ready

    def _release(self, layer: int | None) -> None:
        for entry in self._pass.saved.get(layer, []) if layer is not None else []:
            entry.device_copy = None

    def _end_backward(self) -> None:
        self._release(self._pass.current)
        self._pass.current = None
        self._pass.done = True

    # Bookkeeping.

    def _begin_pass(self) -> None:
        for layer in self._pass.in_flight:
            self._finish_offload(layer)  # a forward without backward: its copies still read the device
        for entries in self._pass.saved.values():
            for entry in entries:
                if entry.host is not None:
                    self.pool.give(entry.host, entry.host_read)
        self._pass = _Pass()
        self.log = []
        self.offloaded_bytes = 0

    def _log_once(self, what: str, layer: int) -> None:
        if (what, layer) not in self.log[-1:]:
            self.log.append((what, layer))

    def _note_residency(self) -> None:
        self.peak_resident_layers = max(self.peak_resident_layers, self.resident_layers_now())
