"""RUN_DIR/samples.jsonl: one typed, versioned line per evaluation with greedy continuations of the prompts.

Written by rank 0 of a training run at each evaluation (:mod:`xtrain.train.sampling`), read by ``xtrain metrics``.
A resumed run evaluates some steps again and appends their lines again: the reader keeps the later line of a
step. Torch-free, so that ``xtrain metrics`` starts quickly.
"""

from __future__ import annotations

import json
from pathlib import Path

from deeptrace.rundir.layout import samples_path
from pydantic import BaseModel, ConfigDict, ValidationError

from xtrain.errors import XtrainError

SAMPLE_RECORD_VERSION = 1


class SamplesInputError(XtrainError):
    """samples.jsonl cannot be read: the message names the file and the line."""


class Sample(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: str
    continuation: str
    """The decoded new tokens (up to and without the eos token, when the model wrote one)."""
    tokens: list[int]
    """The new token ids, the eos token included when the model wrote one."""
    ended: bool
    """Whether the model ended the text (wrote its eos token) before ``eval.sample_tokens`` new tokens."""


class SampleRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    v: int = SAMPLE_RECORD_VERSION
    step: int
    samples: list[Sample]


def append_samples(run_dir: Path, record: SampleRecord) -> None:
    """One line, written in one call (a reader never sees half of a line unless the process dies inside it)."""
    with samples_path(run_dir).open("a", encoding="utf-8") as out:
        out.write(record.model_dump_json() + "\n")


def read_samples(run_dir: Path) -> list[SampleRecord]:
    """The records in step order, the later line of a step logged twice; [] when the file does not exist.

    A last line without its newline (a process that died while writing it) is left out; any other line that is
    not a record of a known version is a SamplesInputError naming the file and line."""
    path = samples_path(run_dir)
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:
        lines.pop()  # cut off mid-line
    by_step: dict[int, SampleRecord] = {}
    for number, line in enumerate(lines, start=1):
        record = _parse(path, number, line)
        by_step[record.step] = record
    return [by_step[step] for step in sorted(by_step)]


def _parse(path: Path, number: int, line: str) -> SampleRecord:
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as error:
        raise SamplesInputError(f"{path}:{number}: not JSON ({error.msg})") from None
    version = raw.get("v") if isinstance(raw, dict) else None
    if isinstance(version, int) and version > SAMPLE_RECORD_VERSION:
        raise SamplesInputError(
            f"{path}:{number}: sample record version {version} is newer than this xtrain reads "
            f"({SAMPLE_RECORD_VERSION}); upgrade xtrain"
        )
    try:
        return SampleRecord.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "line"
        raise SamplesInputError(f"{path}:{number}: {where}: {first['msg']}") from None
