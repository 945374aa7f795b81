"""The training state that is not a tensor and is the same on every rank, as the completion marker carries it.

Typed and versioned: ``TrainState`` is what format version 2 of the marker holds. Version 1 (before the trainer
was made of components) held the same facts as an untyped dict (``scheduler``, ``data``, ``skipped_steps``,
``skipped_in_a_row``); ``from_version_1`` reads it into this model, so such a checkpoint resumes exactly (its DCP
keys, ``model.``/``optim.``/``rng.``, are unchanged).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Counters(BaseModel):
    """Counts the loop keeps across steps, which decide when it stops."""

    model_config = ConfigDict(extra="forbid")

    skipped_steps: int = Field(0, ge=0)
    """Steps whose loss or gradient was not finite (no weight changed), since step 0."""
    skipped_in_a_row: int = Field(0, ge=0)
    """Such steps just before the save: the run stops at ``train.max_skipped_steps_in_a_row``."""


class TrainState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schedule: dict[str, Any]
    """The learning-rate schedule (torch's LambdaLR ``state_dict``: its step count and last rates)."""
    data: dict[str, Any]
    """The data position (``PackStream.state_dict``, versioned by its own ``format``)."""
    counters: Counters

    @classmethod
    def from_version_1(cls, raw: dict[str, Any]) -> TrainState:
        """Format version 1's dict: KeyError when one of its four entries is missing."""
        counters = Counters(skipped_steps=raw["skipped_steps"], skipped_in_a_row=raw["skipped_in_a_row"])
        return cls(schedule=raw["scheduler"], data=raw["data"], counters=counters)
