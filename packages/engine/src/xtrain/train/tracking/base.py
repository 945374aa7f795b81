"""What a tracker does, which scalars it gets, and the wrapper that keeps a failing tracker from stopping a run."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from deeptrace.rundir import RankStepRecord, StepRecord

from xtrain.config import TrainConfig

log = logging.getLogger("xtrain")

SCALARS = ("loss", "aux_loss", "z_loss", "grad_norm", "lr", "tokens_per_s", "mfu", "eval_loss")
"""The step record's figures every tracker gets (with ``memory_*`` from rank 0's record)."""


class Tracker(Protocol):
    name: str

    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def tracked_scalars(record: StepRecord, rank_record: RankStepRecord | None) -> dict[str, float]:
    """The scalars of one step: those of :data:`SCALARS` the record has, and rank 0's memory figures."""
    scalars = {name: float(value) for name in SCALARS if (value := getattr(record, name)) is not None}
    if rank_record is not None:
        for name in ("mem_allocated_bytes", "mem_peak_bytes"):
            value = getattr(rank_record, name)
            if value is not None:
                scalars[f"memory/{name.removeprefix('mem_')}"] = float(value)
    return scalars


class Trackers:
    """The run's trackers. A tracker that raises (at start, on a step, at close) is named in one warning and left
    out from then on: a tracker never stops training."""

    def __init__(self, trackers: list[Tracker]) -> None:
        self._trackers = trackers

    @property
    def names(self) -> list[str]:
        return [tracker.name for tracker in self._trackers]

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for tracker in list(self._trackers):
            self._guard(tracker, f"step {step}", functools.partial(tracker.log, step, scalars))

    def close(self) -> None:
        for tracker in list(self._trackers):
            self._guard(tracker, "closing", tracker.close)
        self._trackers = []

    def _guard(self, tracker: Tracker, when: str, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as error:  # any failure of a tracker's library: the run goes on without it
            log.warning("tracker %s failed (%s: %s: %s); training goes on without it", tracker.name, when,
                        type(error).__name__, error)  # fmt: skip
            self._trackers.remove(tracker)


def open_trackers(config: TrainConfig, run_dir: Path, *, config_name: str, start_step: int) -> Trackers:
    """The trackers of ``[track]`` (rank 0 only), continuing the run's tracked run after a resume from
    ``start_step``. One that cannot start is warned about and left out."""
    opened: list[Tracker] = []
    makers: list[tuple[str, Callable[[], Tracker]]] = []
    track = config.track
    if track.tensorboard:
        from xtrain.train.tracking.tensorboard import TensorBoardTracker  # noqa: PLC0415 (optional extra)

        makers.append(("tensorboard", lambda: TensorBoardTracker(run_dir, start_step)))
    if track.mlflow is not None:
        from xtrain.train.tracking.mlflow_tracker import MlflowTracker  # noqa: PLC0415 (optional extra)

        uri = track.mlflow
        makers.append(("mlflow", lambda: MlflowTracker(uri, config, run_dir, config_name)))
    if track.wandb is not None:
        from xtrain.train.tracking.wandb_tracker import WandbTracker  # noqa: PLC0415 (optional extra)

        makers.append(("wandb", lambda: WandbTracker(run_dir, config, config_name)))
    for name, make in makers:
        try:
            opened.append(make())
        except Exception as error:  # a store that cannot be opened: warned about, never fatal
            log.warning("tracker %s could not start (%s: %s); training goes on without it", name,
                        type(error).__name__, error)  # fmt: skip
    return Trackers(opened)
