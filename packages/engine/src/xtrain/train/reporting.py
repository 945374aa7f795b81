"""The step's records, built and written beside the loop: off its critical path.

After an optimizer step the loop hands over what it measured (:class:`StepFacts`) and goes on with the next
step. A thread of this rank turns the facts into records — FLOP accounting over the packed documents, MFU, the
per-rank record, rank 0's metrics record and progress line — and appends them to the run directory. ``close``
writes what is left, so every record of a finished (or failed) run is on disk when the trainer returns; an error
of the writer thread is raised in the loop at the next step.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import numpy as np
from deeptrace.rundir import CommLinkBytes, RankStepRecord, RunWriter, StepRecord

from xtrain.data import Pack
from xtrain.data.balance import pack_cost
from xtrain.model.config import ModelConfig
from xtrain.model.flops import training_flops_per_token
from xtrain.train.evaluate import EvalResult
from xtrain.train.measure import StepMeasure
from xtrain.train.metrics import MemoryFigures, mfu
from xtrain.train.progress import ProgressLine
from xtrain.train.step import StepResult
from xtrain.train.tracking import Trackers, tracked_scalars


@dataclass(frozen=True)
class RunFigures:
    """What every record of the run shares."""

    model_config: ModelConfig
    world_size: int
    max_steps: int
    start_step: int
    peak_flops: float | None
    is_main: bool


@dataclass(frozen=True)
class Resumed:
    """Where a resumed run came from: the checkpoint's step (0 and no folder: none was found, started over)."""

    from_step: int
    folder: str | None = None
    world_size: int | None = None


@dataclass(frozen=True)
class StepFacts:
    step: int
    result: StepResult
    lr: float
    packs: list[Pack]
    """Every rank's packs of the step (the global batch)."""
    mine: list[Pack]
    """This rank's slice of them."""
    step_time_s: float
    data_wait_s: float
    wall_s: float
    train_elapsed_s: float
    skipped_lines: int
    skipped_steps: int
    memory: MemoryFigures
    checkpoint_stall_s: float | None = None
    """When the step saved: how long the loop waited for it."""
    eval_loss: float | None = None
    """When the step evaluated: the held-out loss."""
    resumed: Resumed | None = None
    """Where the run came from, on the first record after a resume (or after starting over)."""
    measured: StepMeasure | None = None
    """With ``trace.memory``: the step's tensor peak and the bytes this rank sent."""


class StepReporter:
    def __init__(
        self, writer: RunWriter, figures: RunFigures, progress: ProgressLine, trackers: Trackers | None = None
    ) -> None:
        self.writer = writer
        self.figures = figures
        self.progress = progress
        self.trackers = trackers if trackers is not None else Trackers([])
        self._queue: queue.Queue[StepFacts | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="xtrain-step-records", daemon=True)
        self._thread.start()

    def submit(self, facts: StepFacts) -> None:
        self._raise_error()
        self._queue.put(facts)

    def close(self) -> None:
        """Write every record handed over so far, then stop the thread."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self.trackers.close()
        self._raise_error()

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"writing the step records failed: {error}") from error

    def _work(self) -> None:
        while (facts := self._queue.get()) is not None:
            if self._error is not None:
                continue  # the loop raises it; later records are not written over a gap
            try:
                self._write(facts)
            except BaseException as error:  # handed to the loop, which stops
                self._error = error

    def _write(self, facts: StepFacts) -> None:
        mine = rank_record(facts, self.writer.rank)
        self.writer.append_rank_step(mine)
        if self.figures.is_main:
            record = step_record(facts, self.figures)
            self.writer.append_step(record)
            done = facts.step - self.figures.start_step
            eta = facts.train_elapsed_s / done * (self.figures.max_steps - facts.step)
            self.progress.update(facts.step, facts.result.loss, _tokens(facts.packs) / facts.step_time_s, eta_s=eta)
            self.trackers.log(facts.step, tracked_scalars(record, mine))  # never raises: see Trackers


def rank_record(facts: StepFacts, rank: int) -> RankStepRecord:
    measured = facts.measured
    return RankStepRecord(
        step=facts.step,
        rank=rank,
        step_time_s=facts.step_time_s,
        data_wait_s=facts.data_wait_s,
        tokens=_tokens(facts.mine),
        pack_ids=[pack.pack_id for pack in facts.mine],
        attention_cost=sum(pack_cost(pack.pieces) for pack in facts.mine),
        checkpoint_stall_s=facts.checkpoint_stall_s,
        mem_allocated_bytes=facts.memory.allocated,
        mem_peak_bytes=facts.memory.peak,
        mem_reserved_bytes=facts.memory.reserved,
        mem_tensor_peak_bytes=measured.tensor_peak_bytes if measured is not None else None,
        comm_bytes=None if measured is None else _comm_bytes(measured),
        expert_rows=None if measured is None else measured.expert_rows,
    )


def _comm_bytes(measured: StepMeasure) -> dict[str, CommLinkBytes]:
    return {kind: CommLinkBytes(intra=sent.intra, inter=sent.inter) for kind, sent in measured.comm_bytes.items()}


def step_record(facts: StepFacts, figures: RunFigures) -> StepRecord:
    result, resumed = facts.result, facts.resumed
    tokens = _tokens(facts.packs)
    tokens_per_s = tokens / facts.step_time_s
    lengths = [int(n) for pack in facts.packs for n in np.diff(pack.cu_seqlens)]
    utilisation = mfu(
        training_flops_per_token(figures.model_config, lengths), tokens_per_s / figures.world_size, figures.peak_flops
    )
    return StepRecord(
        step=facts.step,
        loss=result.loss,
        aux_loss=result.aux_loss,
        z_loss=result.z_loss,
        grad_norm=result.grad_norm,
        lr=facts.lr,
        tokens=tokens,
        tokens_per_s=tokens_per_s,
        tokens_per_s_per_device=tokens_per_s / figures.world_size,
        mfu=utilisation,
        skipped=result.skipped,
        skipped_lines=facts.skipped_lines,
        skipped_steps=facts.skipped_steps,
        step_time_s=facts.step_time_s,
        wall_s=facts.wall_s,
        max_steps=figures.max_steps,
        checkpoint_stall_s=facts.checkpoint_stall_s,
        eval_loss=facts.eval_loss,
        eval_ppl=None if facts.eval_loss is None else EvalResult(facts.eval_loss).ppl,
        resumed_from_step=None if resumed is None else resumed.from_step,
        resumed_from=None if resumed is None else resumed.folder,
        resumed_from_world_size=None if resumed is None else resumed.world_size,
    )


def _tokens(packs: list[Pack]) -> int:
    return sum(len(pack.input_ids) for pack in packs)
