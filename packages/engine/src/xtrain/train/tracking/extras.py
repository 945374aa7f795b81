"""Which optional extra each tracker needs; checked by the launcher before any process starts."""

from __future__ import annotations

import importlib.util

from xtrain.config import TrainConfig
from xtrain.errors import ConfigError

EXTRAS = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
"""Tracker (its key in ``[track]``) -> the module its extra installs (``pip install 'xtrain[NAME]'``)."""


def wanted_trackers(config: TrainConfig) -> list[str]:
    track = config.track
    return [
        name
        for name, on in (("tensorboard", track.tensorboard), ("mlflow", track.mlflow), ("wandb", track.wandb))
        if on
    ]


def check_tracker_extras(config: TrainConfig) -> None:
    """A ConfigError naming the extra of the first tracker whose package is not installed."""
    for name in wanted_trackers(config):
        if importlib.util.find_spec(EXTRAS[name]) is None:
            raise ConfigError(
                f"track.{name} needs the {EXTRAS[name]} package, which is not installed: pip install 'xtrain[{name}]'"
            )
