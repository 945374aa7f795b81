"""The parts of a run that a checkpoint holds, each a DCP ``Stateful`` (``state_dict`` / ``load_state_dict``).

Registered once with the checkpointer (:class:`TrainingParts`), which never needs to know what they are:

- on the device, saved through DCP (resharded on load): the model (``model.``), the optimizer (``optim.``) and
  each rank's generators (``rng.rank-R.``) — keys as ``torch.distributed.checkpoint.state_dict`` names them,
  with global shapes, so DCP reshards to any world size and HSDP shape;
- on the host, the same on every rank, saved in the completion marker as a typed :class:`TrainState`: the
  learning-rate schedule, the data position and the loop's counters.

Exactness needs every one of them: the weights and the router's correction bias (a persistent buffer, in
``model.``), AdamW's moments and step counts, the schedule, the data position, the skip counters and the
generators. A tensor that several ranks hold under one key is written once (DCP deduplicates replicated tensors),
which is why states that differ per rank have per-rank keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.optim.lr_scheduler import LRScheduler

from xtrain.data import PackStream
from xtrain.train.checkpoint.train_state import Counters, TrainState

RNG_PREFIX = "rng"


class ModelPart:
    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return get_model_state_dict(self.model)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_model_state_dict(self.model, state)


class OptimizerPart:
    """AdamW's moments and step counts, named by parameter (so they follow the parameters' resharding)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, state)


class RngPart:
    """This rank's generator states under its own key: the CPU one and, on an accelerator, that device's.

    A rank beyond the saving world finds no states of its own and keeps its seeded generators: before a load,
    ``expect(saved_keys)`` narrows what it asks DCP for to what the checkpoint holds."""

    def __init__(self, rank: int, device: torch.device) -> None:
        self.key = f"rank-{rank}"
        self.device = device
        self._loadable: set[str] | None = None

    def _states(self) -> dict[str, torch.Tensor]:
        states = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            states["cuda"] = torch.cuda.get_rng_state(self.device)
        return states

    def expect(self, saved_keys: set[str]) -> bool:
        """Keep only the states the checkpoint has for this rank; whether it has any."""
        self._loadable = {name for name in self._states() if f"{RNG_PREFIX}.{self.key}.{name}" in saved_keys}
        return bool(self._loadable)

    def state_dict(self) -> dict[str, Any]:
        states = self._states()
        if self._loadable is not None:
            states = {name: state for name, state in states.items() if name in self._loadable}
        return {self.key: states}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = state.get(self.key, {})
        if "cpu" in mine:
            torch.set_rng_state(mine["cpu"])
        if self.device.type == "cuda" and "cuda" in mine:
            torch.cuda.set_rng_state(mine["cuda"], self.device)
        self._loadable = None


class SchedulePart:
    def __init__(self, scheduler: LRScheduler) -> None:
        self.scheduler = scheduler

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state)


class DataPart:
    """The pack stream's position (independent of the world size: a resumed run takes the packs it would have)."""

    def __init__(self, stream: PackStream) -> None:
        self.stream = stream

    def state_dict(self) -> dict[str, Any]:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state)


class CountersPart:
    """The loop's counters, kept here and changed by the loop through ``record_step``."""

    def __init__(self) -> None:
        self.counters = Counters()

    def record_step(self, skipped: bool) -> None:
        self.counters = Counters(
            skipped_steps=self.counters.skipped_steps + int(skipped),
            skipped_in_a_row=self.counters.skipped_in_a_row + 1 if skipped else 0,
        )

    def state_dict(self) -> dict[str, Any]:
        return self.counters.model_dump()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counters = Counters.model_validate(state)


class Checkpointed(Protocol):
    """What the checkpointer saves and a load restores: the device parts (for DCP) and the host state."""

    @property
    def rng(self) -> RngPart: ...

    def device_state(self) -> dict[str, Any]: ...

    def host_state(self) -> TrainState: ...


@dataclass(frozen=True)
class TrainingParts:
    model: ModelPart
    optimizer: OptimizerPart
    rng: RngPart
    schedule: SchedulePart
    data: DataPart
    counters: CountersPart

    def device_state(self) -> dict[str, Any]:
        """What DCP saves and loads (Stateful values: DCP calls their state_dict / load_state_dict)."""
        return {"model": self.model, "optim": self.optimizer, RNG_PREFIX: self.rng}

    def host_state(self) -> TrainState:
        counters = Counters.model_validate(self.counters.state_dict())
        return TrainState(schedule=self.schedule.state_dict(), data=self.data.state_dict(), counters=counters)

    def load_host_state(self, state: TrainState) -> None:
        self.schedule.load_state_dict(state.schedule)
        self.counters.load_state_dict(state.counters.model_dump())
