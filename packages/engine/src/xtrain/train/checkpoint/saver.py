"""Saving checkpoints while training: ``checkpoint.every_steps``, ``keep``, ``async``, ``hf_every_steps``.

A save goes to RUN_DIR/checkpoints/step-N/. Every rank hands its state to DCP (``dcp.save``, or
``dcp.async_save``, which returns once the state is copied to host memory and writes from a thread); DCP's
coordinator writes ``.metadata`` after it has every rank's write results, and then — only then — rank 0 writes
the completion marker (:mod:`.manifest`). A kill at any moment before the marker leaves a folder that resuming
skips, and the previous checkpoint untouched.

Checkpoint collectives run on a process group of their own (gloo): an asynchronous save plans and finishes from
its thread while the training thread keeps using the default group, and two threads must never interleave
collectives on one group. At most one save is in flight: the next one (or the end of training) waits for it.
The ranks agree, at each step, whether every rank's part of an asynchronous save is written (one small
all-reduce on a third group, only while a save is in flight), so all finish it, or stop on its failure, at the
same step.

The marker lists every file of the checkpoint with its checksum (:mod:`.integrity`). A save that fails stops
the run on every rank: for a full disk (ENOSPC, or a quota) with one message naming the run directory and the
bytes the checkpoint needs; the failed save's folder is removed (it never got a marker) and older checkpoints
are left as they are.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import shutil
import time
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from deeptrace.collect import Collector
from deeptrace.rundir import layout
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse, async_save, save

from xtrain import __version__
from xtrain.config import CheckpointSection
from xtrain.errors import CheckpointError, TrainingStoppedError
from xtrain.train.checkpoint.export_background import BackgroundExports
from xtrain.train.checkpoint.integrity import collect_digests
from xtrain.train.checkpoint.locate import DCP_METADATA, is_complete
from xtrain.train.checkpoint.manifest import CONFIG_FILE, MARKER, Manifest, write_manifest
from xtrain.train.checkpoint.parts import Checkpointed
from xtrain.train.checkpoint.storage import CheckpointWriter
from xtrain.train.lifeline import StopRequested

log = logging.getLogger("xtrain")


@dataclass
class _InFlight:
    folder: Path
    manifest: Manifest
    future: Future[Any] | None
    """None once written (a synchronous save, or an asynchronous one that finished)."""
    error: BaseException | None = None
    """What a synchronous save raised."""


_OK, _FAILED, _DISK_FULL = 0, 1, 2
"""How a save ended on a rank; the ranks agree on the maximum (a full disk explains the other failures)."""
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class RunIdentity:
    """What every checkpoint of this run says about the run that saved it (the marker's fixed fields)."""

    world_size: int
    replicate: int
    config_toml: str
    model_config: dict[str, Any]
    """``ModelConfig`` as JSON: an export needs neither the config's files nor the HF folder it started from."""


class Checkpointer:
    """One per rank; every rank calls every method at the same step (they run collectives). The parts it saves
    are registered once, here; it asks each for its state at save time."""

    def __init__(
        self,
        settings: CheckpointSection,
        run_dir: Path,
        parts: Checkpointed,
        identity: RunIdentity,
        collector: Collector | None,
    ) -> None:
        self.settings = settings
        self.run_dir = run_dir
        self.parts = parts
        self.identity = identity
        self.collector = collector
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        several = dist.is_initialized() and dist.get_world_size() > 1
        self.group = dist.new_group(backend="gloo") if settings.every_steps else None
        # Used from the training thread while an asynchronous save's thread may be using ``group``.
        self._poll_group = dist.new_group(backend="gloo") if several and settings.async_save else None
        self._several = several
        self._in_flight: _InFlight | None = None
        self._writer = CheckpointWriter(layout.checkpoints_dir(run_dir))
        self._exports = BackgroundExports(run_dir) if self.rank == 0 and settings.hf_every_steps else None

    def due(self, step: int, last_step: int) -> bool:
        every = self.settings.every_steps
        return every > 0 and (step % every == 0 or step == last_step)

    def save(self, step: int) -> float:
        """Save every part's state after optimizer step ``step``; returns how long the loop was blocked (s)."""
        started = time.perf_counter()
        self._finish_in_flight()  # one save in flight at most
        folder = layout.checkpoint_dir(self.run_dir, step)
        identity = self.identity
        manifest = Manifest(
            step=step,
            world_size=identity.world_size,
            replicate=identity.replicate,
            train_state=self.parts.host_state(),
            config_toml=identity.config_toml,
            model_config=identity.model_config,
            xtrain_version=__version__,
            saved_unix_s=time.time(),
        )
        with self._phase():
            self._in_flight = self._write(folder, manifest)
            if self._in_flight.future is None:
                self._finish_in_flight()
        return time.perf_counter() - started

    def _write(self, folder: Path, manifest: Manifest) -> _InFlight:
        """DCP's save of the device parts; an asynchronous one holds the write's future."""
        state = self.parts.device_state()
        if not self.settings.async_save:
            try:
                save(state, checkpoint_id=folder, storage_writer=self._writer, process_group=self.group)
            except (Exception, CheckpointException) as error:  # DCP raises the same on every rank
                return _InFlight(folder, manifest, None, error)
            return _InFlight(folder, manifest, None)
        response = async_save(state, checkpoint_id=folder, storage_writer=self._writer, process_group=self.group)
        # Depending on the stager, DCP answers with the write's future or a response that holds it.
        future = response.upload_completion if isinstance(response, AsyncSaveResponse) else response
        return _InFlight(folder, manifest, future)

    def poll(self) -> None:
        """Finish an asynchronous save whose files are all written on every rank (marker, clean-up), or stop on its
        failure; waits for no write."""
        in_flight = self._in_flight
        if in_flight is None or in_flight.future is None:
            return
        done = in_flight.future.done()
        if self._poll_group is not None:
            every_rank = torch.tensor([int(done)])
            dist.all_reduce(every_rank, op=dist.ReduceOp.MIN, group=self._poll_group)
            done = bool(every_rank.item())
        if done:
            self._finish_in_flight()

    def close(self) -> None:
        """Wait for the save in flight and for Hugging Face exports (the end of training)."""
        self._finish_in_flight()
        if self._exports is not None:
            self._exports.wait_all()

    def _finish_in_flight(self) -> None:
        """Wait for the save in flight; rank 0 completes it (checksums, marker, retention). A failure on any rank
        stops every rank with the same error."""
        in_flight = self._in_flight
        if in_flight is None:
            return
        self._in_flight = None
        error = in_flight.error
        if in_flight.future is not None:
            try:
                in_flight.future.result()
            except (Exception, CheckpointException) as failed:
                error = failed
        if error is not None:
            stop = _stop_request(error)
            if stop is not None:
                raise stop  # SIGTERM in the save: abandoned (no marker), the run stops
        elif self.rank == 0:
            # DCP's coordinator (rank 0) wrote .metadata after gathering every rank's results: all files are there.
            try:
                self._complete(in_flight)
            except OSError as failed:
                error = failed
        outcome = self._agree(_OK if error is None else _DISK_FULL if self._disk_full(error, in_flight) else _FAILED)
        if outcome == _OK:
            self._after_complete(in_flight)
            return
        if self.rank == 0:
            shutil.rmtree(in_flight.folder, ignore_errors=True)  # no marker: never loaded; frees what it took
        if outcome == _DISK_FULL:
            raise CheckpointError(self._disk_full_message(in_flight))
        if error is not None:
            raise error  # the run stops rather than go on unprotected
        raise TrainingStoppedError(
            f"the checkpoint of step {in_flight.manifest.step} could not be completed on rank 0 (see its output)"
        )

    def _complete(self, in_flight: _InFlight) -> None:
        """Rank 0, every rank's files written: the config beside them, every file's checksum, the marker last."""
        folder = in_flight.folder
        (folder / CONFIG_FILE).write_text(self.identity.config_toml)
        files = collect_digests(folder, also=(DCP_METADATA, CONFIG_FILE))
        write_manifest(folder, dataclasses.replace(in_flight.manifest, files=files))

    def _after_complete(self, in_flight: _InFlight) -> None:
        if self.rank != 0:
            return
        log.info("checkpoint %s complete", in_flight.folder)
        self._prune(in_flight.manifest.step)
        if self._exports is not None and in_flight.manifest.step % self.settings.hf_every_steps == 0:
            self._exports.start(in_flight.folder, in_flight.manifest.step)

    def _agree(self, outcome: int) -> int:
        """The worst outcome over the ranks (the save's thread is done with ``group`` here)."""
        if not self._several or self.group is None:
            return outcome
        worst = torch.tensor([outcome])
        dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=self.group)
        return int(worst.item())

    def _disk_full(self, error: BaseException, in_flight: _InFlight) -> bool:
        """ENOSPC or EDQUOT somewhere in the failure, or a failed write on a device without room for this rank's
        share (torch's zip writer reports a short write as a RuntimeError, without the errno)."""
        if _disk_full(error):
            return True
        folder = in_flight.folder if in_flight.folder.exists() else in_flight.folder.parent
        try:
            return shutil.disk_usage(folder).free < self._writer.planned_bytes
        except OSError:
            return False

    def _disk_full_message(self, in_flight: _InFlight) -> str:
        needed = torch.tensor([self._writer.planned_bytes], dtype=torch.int64)
        if self._several and self.group is not None:
            dist.all_reduce(needed, group=self.group)
        total = int(needed.item())
        return (
            f"no space left on the device of run directory {self.run_dir}: the checkpoint of step "
            f"{in_flight.manifest.step} needs {total} bytes ({total / 2**20:.1f} MiB) in "
            f"{in_flight.folder.parent}; it was not saved (no {MARKER} marker), older checkpoints are kept. "
            "Free that much space there and resume with --resume auto"
        )

    def _prune(self, newest: int) -> None:
        """Keep the newest ``keep`` complete checkpoints; remove older ones and interrupted saves older than the
        newest (no save is in flight here). The marker goes first, so a half-deleted folder is never complete."""
        folders = layout.checkpoint_step_folders(self.run_dir)
        complete = [step for step, folder in folders if is_complete(folder)]
        kept = set(complete[-self.settings.keep :]) if self.settings.keep else set(complete)
        for step, folder in folders:
            if step < newest and step not in kept:
                (folder / MARKER).unlink(missing_ok=True)
                shutil.rmtree(folder, ignore_errors=True)

    def _phase(self) -> AbstractContextManager[object]:
        if self.collector is None:
            return contextlib.nullcontext()
        return self.collector.phase("checkpoint")


def _causes(error: BaseException) -> list[BaseException]:
    """The error, what it was raised from, and for DCP's CheckpointException every rank's failure in it."""
    seen: list[BaseException] = []
    pending = [error]
    while pending:
        current = pending.pop()
        if any(current is known for known in seen):
            continue
        seen.append(current)
        pending += [cause for cause in (current.__cause__, current.__context__) if cause is not None]
        if isinstance(current, CheckpointException):
            pending += [wrapped for wrapped, _trace in current.failures.values()]
    return seen


def _disk_full(error: BaseException) -> bool:
    return any(isinstance(cause, OSError) and cause.errno in _DISK_FULL_ERRNOS for cause in _causes(error))


def _stop_request(error: BaseException) -> StopRequested | None:
    return next((cause for cause in _causes(error) if isinstance(cause, StopRequested)), None)


def set_aside_corrupted(folders: list[Path], warn: Any) -> None:
    """Rank 0, resuming from an older checkpoint: move each complete but corrupted checkpoint it fell back from to
    ``checkpoints/corrupt-step-N`` (never loaded, never pruned, nothing deleted), so the run can save that step
    again."""
    for folder in folders:
        target = folder.with_name(f"corrupt-{folder.name}")
        suffix = 1
        while target.exists():
            suffix += 1
            target = folder.with_name(f"corrupt-{folder.name}-{suffix}")
        folder.rename(target)
        warn(f"moved {folder} to {target}: its files do not verify; nothing in it was deleted")


def discard_later_checkpoints(run_dir: Path, step: int, warn: Any) -> None:
    """Rank 0, before a run resumed at ``step`` writes anything: folders of later steps are left over from the
    interrupted attempt (or belong to the history this run replaces), and would be mistaken for its own."""
    for later, folder in layout.checkpoint_step_folders(run_dir):
        if later > step:
            state = "complete" if is_complete(folder) else "incomplete"
            warn(f"removing {folder} ({state}, later than step {step}, where this run resumes)")
            (folder / MARKER).unlink(missing_ok=True)
            shutil.rmtree(folder, ignore_errors=True)
