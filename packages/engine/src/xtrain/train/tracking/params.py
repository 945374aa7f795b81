"""The resolved config as flat tracker parameters: ``section.key`` -> value."""

from __future__ import annotations

from typing import Any

from xtrain.config import TrainConfig

MAX_VALUE_CHARS = 500  # MLflow's limit for a parameter value


def config_params(config: TrainConfig) -> dict[str, str]:
    flat: dict[str, str] = {}
    for section, values in config.model_dump(mode="json", by_alias=True).items():
        if isinstance(values, dict):
            for key, value in values.items():
                flat[f"{section}.{key}"] = _text(value)
    return flat


def _text(value: Any) -> str:
    text = str(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."
