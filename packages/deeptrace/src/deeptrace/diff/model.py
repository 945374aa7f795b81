"""What `deeptrace diff` reports, as typed models: the --json output is `DiffReport.model_dump(mode="json")`.

Times are microseconds (`_us`), like HTA's TraceDiff, so its figures and these compare directly. `delta` is always
B − A. Every list is sorted by the size of the change, largest first.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OpRow(_Model):
    """One op name (CPU operator or annotation, GPU kernel, copy): count and total time on each side."""

    name: str
    a_count: int
    b_count: int
    a_total_us: float
    b_total_us: float
    delta_us: float


class KindRow(_Model):
    """One kind (or purpose) of collective on the compared rank, over the compared steps."""

    a_count: int
    b_count: int
    a_bytes: int | None  # null where the input gives no sizes
    b_bytes: int | None
    a_total_us: float
    b_total_us: float
    a_exposed_us: float
    b_exposed_us: float
    delta_exposed_us: float


class RankRow(_Model):
    """One rank: step time and exposed communication per step (mean over the compared steps); null where the
    rank is absent on that side."""

    rank: int
    a_step_us: float | None
    b_step_us: float | None
    a_exposed_us: float | None
    b_exposed_us: float | None
    delta_step_us: float | None
    delta_exposed_us: float | None


class Side(_Model):
    path: str
    rank: int | None  # the rank whose ops, spans and collectives are compared
    steps: list[int]  # the steps compared on this side
    kineto: str | None  # the Kineto trace the ops come from
    collector: str | None  # the collector trace the spans come from


class DiffReport(_Model):
    format: str = "deeptrace.diff"
    format_version: int = 1
    step: str  # "first", "all" or the step number
    a: Side
    b: Side
    ops: list[OpRow]
    collectives: dict[str, KindRow]
    purposes: dict[str, KindRow]
    ranks: list[RankRow]
    spans: list[OpRow]
    warnings: list[str]
