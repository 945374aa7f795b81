"""RunWriter: how a training job writes its run directory (meta, config, step records, per-rank step records).

Rank 0 writes the run-wide files (meta.json, config.toml, metrics.jsonl); every rank writes its own
ranks/rank-{R}.jsonl. Spans and heartbeats are written by `deeptrace.collect.Collector`. Every JSON Lines record is
one `write` of the object and its newline, flushed at once, so readers see whole lines or a partly written last
line, never an interleaving.
"""

from __future__ import annotations

import os
import platform
import socket
import time
import uuid
from pathlib import Path
from typing import IO, Any

from deeptrace import __version__
from deeptrace.rundir import layout
from deeptrace.rundir.jsonio import dumps, write_atomically
from deeptrace.rundir.records import RunMeta
from deeptrace.rundir.step_records import RankStepRecord, StepRecord


class RunDirectoryError(ValueError):
    """A run directory used in a way the format does not allow (the message says how to fix it)."""


class RunWriter:
    """Writes one rank's share of a run directory. Use as a context manager or call `close()`."""

    def __init__(self, run_dir: Path | str, rank: int, world_size: int) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise RunDirectoryError(f"rank {rank} is not within world size {world_size}: pass 0 <= rank < world_size")
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.world_size = world_size
        self.run_dir.mkdir(parents=True, exist_ok=True)
        layout.ranks_dir(self.run_dir).mkdir(exist_ok=True)
        self._metrics: IO[bytes] | None = None
        self._rank_records: IO[bytes] | None = None

    def _require_rank0(self, what: str) -> None:
        if self.rank != 0:
            raise RunDirectoryError(f"{what} is written by rank 0 only (this writer is rank {self.rank})")

    def write_meta(
        self,
        *,
        run_id: str | None = None,
        start_time_unix_s: float | None = None,
        hosts: list[str] | None = None,
        rank_hosts: dict[int, str] | None = None,
        versions: dict[str, str] | None = None,
        model_flops_per_token: float | None = None,
        device_peak_flops: float | None = None,
        extras: dict[str, Any] | None = None,
    ) -> RunMeta:
        """Write meta.json (rank 0). Missing values are filled in: a fresh run id, now, this host for every rank.

        `versions` is merged over the ones known here (python, deeptrace, platform); `device_peak_flops` is per
        device in FLOP/s for the training dtype; `model_flops_per_token` counts forward and backward.
        """
        self._require_rank0("meta.json")
        host = host_name()
        if rank_hosts is None:
            rank_hosts = dict.fromkeys(range(self.world_size), host)
        if hosts is None:
            hosts = sorted(set(rank_hosts.values()))
        meta = RunMeta(
            run_id=run_id or uuid.uuid4().hex[:12],
            start_time_unix_s=time.time() if start_time_unix_s is None else start_time_unix_s,
            world_size=self.world_size,
            hosts=hosts,
            rank_hosts=rank_hosts,
            versions={
                "python": platform.python_version(),
                "deeptrace": __version__,
                "platform": platform.platform(),
                **(versions or {}),
            },
            model_flops_per_token=model_flops_per_token,
            device_peak_flops=device_peak_flops,
            extras=extras or {},
            format_version=layout.FORMAT_VERSION,
        )
        write_atomically(layout.meta_path(self.run_dir), dumps(meta.to_dict(), indent=True) + b"\n")
        return meta

    def write_config_toml(self, text: str) -> None:
        """Write the run's resolved configuration (rank 0), as the TOML text the trainer resolved."""
        self._require_rank0("config.toml")
        write_atomically(layout.config_path(self.run_dir), text.encode())

    def append_step(self, record: StepRecord) -> None:
        """Append one optimizer step's record to metrics.jsonl (rank 0), flushed before returning."""
        self._require_rank0("metrics.jsonl")
        if self._metrics is None:
            self._metrics = layout.metrics_path(self.run_dir).open("ab", buffering=0)
        self._metrics.write(record.to_line())

    def append_rank_step(self, record: RankStepRecord) -> None:
        """Append this rank's record of one step to ranks/rank-{R}.jsonl, flushed before returning."""
        if record.rank != self.rank:
            raise RunDirectoryError(f"a record of rank {record.rank} given to the writer of rank {self.rank}")
        if self._rank_records is None:
            path = layout.rank_records_path(self.run_dir, self.rank)
            self._rank_records = path.open("ab", buffering=0)
        self._rank_records.write(record.to_line())

    def close(self) -> None:
        for handle in (self._metrics, self._rank_records):
            if handle is not None:
                handle.close()
        self._metrics = self._rank_records = None

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


HOST_ENV = "DEEPTRACE_HOST"


def host_name() -> str:
    """This node's name as the run directory records it: $DEEPTRACE_HOST when set, else the host name.

    The override exists for containers whose host name is not the node's, and so that one machine can stand for
    several nodes in tests (`deeptrace watch --node` helpers answer for the ranks of their own host name).
    """
    return os.environ.get(HOST_ENV) or socket.gethostname()


def process_identity() -> tuple[str, int]:
    """(host name, pid) of this process, as heartbeats and clock references record them."""
    return host_name(), os.getpid()
