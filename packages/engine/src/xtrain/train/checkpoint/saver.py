"""Saving checkpoints while training: ``checkpoint.every_steps``, ``keep``, ``async``, ``hf_every_steps``.

A save goes to RUN_DIR/checkpoints/step-N/. Every rank hands its state to DCP (``dcp.save``, or
``dcp.async_save``, which returns once the state is copied to host memory and writes from a thread); DCP's
coordinator writes ``.metadata`` after it has every rank's write results, and then — only then — rank 0 writes
the completion marker (:mod:`.manifest`). A kill at any moment before the marker leaves a folder that resuming
skips, and the previous checkpoint untouched.

Checkpoint collectives run on a process group of their own (gloo): an asynchronous save plans and finishes from
its thread while the training thread keeps using the default group, and two threads must never interleave
collectives on one group. At most one save is in flight: the next one (or the end of training) waits for it.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
from deeptrace.collect import Collector
from deeptrace.rundir import layout
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse, async_save, save

from xtrain import __version__
from xtrain.config import CheckpointSection
from xtrain.train.checkpoint.export_background import BackgroundExports
from xtrain.train.checkpoint.locate import is_complete
from xtrain.train.checkpoint.manifest import CONFIG_FILE, MARKER, Manifest, write_manifest
from xtrain.train.checkpoint.parts import Checkpointed
from xtrain.train.checkpoint.storage import CheckpointWriter

log = logging.getLogger("xtrain")


@dataclass
class _InFlight:
    folder: Path
    manifest: Manifest
    future: Future[Any] | None
    """None once written (a synchronous save, or an asynchronous one that finished)."""


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
        self.group = dist.new_group(backend="gloo") if settings.every_steps else None
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
        if self.rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / CONFIG_FILE).write_text(identity.config_toml)
        with self._phase():
            self._in_flight = _InFlight(folder, manifest, self._write(folder))
            if self._in_flight.future is None:
                self._finish_in_flight()
        return time.perf_counter() - started

    def _write(self, folder: Path) -> Future[Any] | None:
        """DCP's save of the device parts; an asynchronous one returns the write's future."""
        state = self.parts.device_state()
        if not self.settings.async_save:
            save(state, checkpoint_id=folder, storage_writer=self._writer, process_group=self.group)
            return None
        response = async_save(state, checkpoint_id=folder, storage_writer=self._writer, process_group=self.group)
        # Depending on the stager, DCP answers with the write's future or a response that holds it.
        return response.upload_completion if isinstance(response, AsyncSaveResponse) else response

    def poll(self) -> None:
        """Finish an asynchronous save whose files are all written (marker, clean-up); never blocks."""
        in_flight = self._in_flight
        if in_flight is not None and in_flight.future is not None and in_flight.future.done():
            self._finish_in_flight()

    def close(self) -> None:
        """Wait for the save in flight and for Hugging Face exports (the end of training)."""
        self._finish_in_flight()
        if self._exports is not None:
            self._exports.wait_all()

    def _finish_in_flight(self) -> None:
        in_flight = self._in_flight
        if in_flight is None:
            return
        self._in_flight = None
        if in_flight.future is not None:
            in_flight.future.result()  # a failed write raises here: the run stops rather than go on unprotected
        if self.rank != 0:
            return
        # DCP's coordinator (rank 0) wrote .metadata after gathering every rank's results: all files are there.
        write_manifest(in_flight.folder, in_flight.manifest)
        log.info("checkpoint %s complete", in_flight.folder)
        self._prune(in_flight.manifest.step)
        if self._exports is not None and in_flight.manifest.step % self.settings.hf_every_steps == 0:
            self._exports.start(in_flight.folder, in_flight.manifest.step)

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


def discard_later_checkpoints(run_dir: Path, step: int, warn: Any) -> None:
    """Rank 0, before a run resumed at ``step`` writes anything: folders of later steps are left over from the
    interrupted attempt (or belong to the history this run replaces), and would be mistaken for its own."""
    for later, folder in layout.checkpoint_step_folders(run_dir):
        if later > step:
            state = "complete" if is_complete(folder) else "incomplete"
            warn(f"removing {folder} ({state}, later than step {step}, where this run resumes)")
            (folder / MARKER).unlink(missing_ok=True)
            shutil.rmtree(folder, ignore_errors=True)
