"""The typed records of the run directory's JSON Lines files: `StepRecord` (metrics.jsonl, one per optimizer step,
rank 0) and `RankStepRecord` (ranks/rank-{R}.jsonl, one per step of rank R).

Each line carries `format_version` (a line without one was written before records had it, and is version 1). A
reader refuses a newer version with one message that names the file and the line, as it does for meta.json. The
fields a training loop may write are declared here with their types; figures of a loop's own (named with their
unit) are kept as `extras` and written flat beside them, so a trainer can add one without a format change.
Field meanings and units: docs/run-directory.md.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from deeptrace.errors import TraceInputError
from deeptrace.rundir.jsonio import dumps
from deeptrace.rundir.jsonl import parse_json_line

STEP_RECORD_VERSION = 1


class _LineRecord(BaseModel):
    """One line of a JSON Lines file of the run directory: validated on read, one `to_line()` on write."""

    # strict: a string never passes for a number, nor a bool for an int; floats accept ints (JSON has one number).
    model_config = ConfigDict(extra="allow", frozen=True, strict=True)
    supported_version: ClassVar[int] = STEP_RECORD_VERSION

    format_version: int = STEP_RECORD_VERSION
    step: int
    time_unix_s: float = Field(default_factory=time.time)
    """When the record was written, Unix seconds."""

    @property
    def extras(self) -> dict[str, Any]:
        """The loop's own figures, beyond the declared fields."""
        return dict(self.model_extra or {})

    def to_line(self) -> bytes:
        """The JSON line (with its newline) as written: fields without a value are left out; NaN and infinities
        become null, as JSON has none."""
        return dumps(self.model_dump(mode="python", exclude_none=True)) + b"\n"

    @classmethod
    def from_object(cls, obj: dict[str, Any], path: Path, line: int | None = None) -> Self:
        version = obj.get("format_version", 1)
        if isinstance(version, int) and not isinstance(version, bool) and version > cls.supported_version:
            raise TraceInputError(
                path,
                f"format_version {version} is newer than this deeptrace understands ({cls.supported_version}); "
                "upgrade deeptrace to read it",
                line=line,
            )
        try:
            return cls.model_validate(obj)
        except ValidationError as error:
            raise TraceInputError(path, _first_problem(error), line=line) from None

    @classmethod
    def from_line(cls, path: Path, line: int, raw: bytes) -> Self:
        return cls.from_object(parse_json_line(path, line, raw), path, line)


def _first_problem(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "record"
    if first["type"] == "missing":
        return f"missing field '{where}'"
    return f"field '{where}': {first['msg'].lower()} (found {first['input']!r})"


class StepRecord(_LineRecord):
    """metrics.jsonl: one optimizer step of the run, written by rank 0. Every figure but `step` is optional, so
    that any training loop can write the ones it has; xtrain writes them all."""

    loss: float | None = None
    aux_loss: float | None = None
    z_loss: float | None = None
    grad_norm: float | None = None
    """Before clipping; null when not finite."""
    lr: float | None = None
    tokens: int | None = None
    """Tokens of the step over all ranks."""
    tokens_per_s: float | None = None
    tokens_per_s_per_device: float | None = None
    mfu: float | None = None
    """Model FLOP utilisation, 0–1; absent when the device's peak is not known."""
    step_time_s: float | None = None
    wall_s: float | None = None
    """Seconds since the run (this attempt) started."""
    max_steps: int | None = None
    skipped: bool = False
    """The step's update was skipped (a loss or gradient that is not finite)."""
    skipped_lines: int | None = None
    skipped_steps: int | None = None
    checkpoint_stall_s: float | None = None
    """Time the loop waited for a checkpoint save at this step."""
    eval_loss: float | None = None
    """Held-out loss (cross-entropy per target token over the evaluation packs), at the steps that evaluate."""
    eval_ppl: float | None = None
    """exp(eval_loss)."""
    resumed_from_step: int | None = None
    """On the first record after a resume: the checkpoint's step (0: no checkpoint was found, started over)."""
    resumed_from: str | None = None
    resumed_from_world_size: int | None = None


class CommLinkBytes(BaseModel):
    """Bytes a rank sent in one kind of collective during a step, by link (``RankStepRecord.comm_bytes``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    intra: int
    """To ranks on the rank's own node."""
    inter: int
    """To ranks on other nodes."""


class RankStepRecord(_LineRecord):
    """ranks/rank-{R}.jsonl: one step of rank R. Memory figures are of one measure family per device (the peak
    is the high-water mark of the allocated figure, never below it)."""

    rank: int
    step_time_s: float | None = None
    data_wait_s: float | None = None
    mem_allocated_bytes: int | None = None
    mem_peak_bytes: int | None = None
    mem_reserved_bytes: int | None = None
    tokens: int | None = None
    """Tokens of this rank's packs in the step."""
    pack_ids: list[int] | None = None
    attention_cost: int | None = None
    """Σ L(L+1)/2 over the documents of this rank's packs: its attention work."""
    checkpoint_stall_s: float | None = None
    mem_tensor_peak_bytes: int | None = None
    """The step's exact peak of bytes held by tensors on the rank's device (a trainer's memory trace)."""
    comm_bytes: dict[str, CommLinkBytes] | None = None
    """Bytes the rank sent during the step per collective kind (``all_gather``, ``reduce_scatter``,
    ``all_reduce``, ``all_to_all``), by link (a trainer's memory trace)."""
    expert_rows: list[int] | None = None
    """Under expert parallelism: the rows the rank's experts received per MoE layer (in layer order) in the
    step's last forward, the routing its memory depends on (a trainer's memory trace)."""
