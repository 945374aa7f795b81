"""PyTorch profiler (Kineto) trace → RankTable, in one streaming pass that keeps only what the analyses need.

Kept per GPU event (kernel, memcpy, memset, sync): start, end, category, stream, name, correlation id, and the
NCCL metadata Kineto copies into the kernel's args (process group, sequence number). Kept per CPU launch
(cuda_runtime / cuda_driver events): correlation id and time. Kept per `ProfilerStep#N`: its window. Everything
else (CPU operators, python functions, flows) is decoded and dropped at once.

A trace without any GPU event (a CPU-only run with gloo) is read again for its CPU threads instead
(`deeptrace.kineto.cpu_reader`).

Steps are mapped to GPU time as HTA does: a kernel belongs to the ProfilerStep whose CPU window contains the CPU
call that launched it (found through the correlation id), not to the step its GPU time falls in.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from deeptrace.analysis.intervals import I64
from deeptrace.analysis.table import CODE, RankTable, _Interner
from deeptrace.classify import GPU_EVENT_CATEGORIES, KernelClassifier
from deeptrace.errors import TraceInputError
from deeptrace.kineto.cpu_reader import read_cpu_table
from deeptrace.kineto.steps import NO_TIME, assign_steps, profiler_step
from deeptrace.kineto.stream import TraceEventStream
from deeptrace.spans import Category

KINETO_MARKERS = ("schemaVersion", "distributedInfo", "deviceProperties")
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
_RANK_IN_NAME = re.compile(r"rank[-_.]?(\d+)", re.IGNORECASE)
# Bytes per element of the `dtype` names Kineto writes into an NCCL kernel's metadata.
_DTYPE_BYTES = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Int": 4, "Long": 8, "Short": 2, "Char": 1,
                "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1}  # fmt: skip


def _ns(us: Any) -> int:
    """Kineto times are microseconds (int, or float with ns digits)."""
    ns: int = round(us * 1000)
    return ns


def rank_from_file_name(path: Path) -> int | None:
    found = _RANK_IN_NAME.search(path.name)
    return int(found.group(1)) if found else None


def trace_rank(meta: dict[str, Any], path: Path) -> tuple[int, int | None, list[str]]:
    """(rank, world size, warnings) of a trace from its metadata, else the rank from the file name."""
    info = meta.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    rank = info.get("rank") if isinstance(info.get("rank"), int) else None
    warnings: list[str] = []
    if rank is None:
        rank = rank_from_file_name(path)
        if rank is None:
            raise TraceInputError(path, "no distributedInfo.rank and no rank-N in the file name: cannot tell the rank")
        warnings.append(f"{path}: no distributedInfo.rank in the trace; rank {rank} taken from the file name")
    world_size = info.get("world_size") if isinstance(info.get("world_size"), int) else None
    return rank, world_size, warnings


def nccl_message_bytes(args: dict[str, Any]) -> int:
    """Bytes of an NCCL kernel's message from Kineto's metadata: the larger of input and output (an all-gather's
    output, a reduce-scatter's input: the full tensor), -1 when the metadata is absent."""
    size = _DTYPE_BYTES.get(str(args.get("dtype")))
    nelems = [n for n in (args.get("In msg nelems"), args.get("Out msg nelems")) if isinstance(n, int)]
    return max(nelems) * size if size is not None and nelems else -1


class _Collected:
    """What one pass over the events keeps, in compact arrays."""

    def __init__(self, classifier: KernelClassifier) -> None:
        self.classifier = classifier
        self.start, self.end, self.correlation, self.seq = array("q"), array("q"), array("q"), array("q")
        self.category = array("b")
        self.track, self.name, self.group = array("i"), array("i"), array("i")
        self.nbytes = array("q")
        self.names, self.tracks, self.groups = _Interner(), _Interner(), _Interner()
        self.launch_corr, self.launch_ts = array("q"), array("q")
        self.steps: list[tuple[int, int, int]] = []  # (step number, start ns, end ns) of ProfilerStep CPU spans
        self.unclassified: Counter[str] = Counter()
        self._track_of: dict[tuple[Any, Any], int] = {}

    def add(self, event: dict[str, Any]) -> None:
        cat = event.get("cat")
        if cat in GPU_EVENT_CATEGORIES:
            self._add_gpu(event, cat)
        elif cat in LAUNCH_CATEGORIES:
            correlation = (event.get("args") or {}).get("correlation")
            if isinstance(correlation, int):
                self.launch_corr.append(correlation)
                self.launch_ts.append(_ns(event["ts"]))
        elif cat != "gpu_user_annotation":
            name = event.get("name")
            if isinstance(name, str) and name.startswith("ProfilerStep"):
                step = profiler_step(name, _ns(event["ts"]), _ns(event.get("dur", 0)))
                if step is not None:
                    self.steps.append(step)

    def _add_gpu(self, event: dict[str, Any], cat: str) -> None:
        args = event.get("args") or {}
        name = str(event.get("name", ""))
        start = _ns(event["ts"])
        category = self.classifier.classify(name, cat)
        if category is Category.OTHER:
            self.unclassified[name] += 1
        self.start.append(start)
        self.end.append(start + _ns(event.get("dur", 0)))
        self.category.append(CODE[category])
        where = (args.get("device"), args.get("stream"))
        track = self._track_of.get(where)
        if track is None:
            track = self._track_of[where] = self.tracks(f"gpu {where[0]} stream {where[1]}")
        self.track.append(track)
        self.name.append(self.names(name))
        self.correlation.append(int(args.get("correlation", -1)))
        if category is Category.COMM:
            group = args.get("Process Group Name")
            self.group.append(self.groups(f"pg {group}" if group is not None else f"stream {args.get('stream')}"))
            seq = args.get("Seq", args.get("seq"))
            self.seq.append(int(seq) if isinstance(seq, int | str) and str(seq).isdigit() else -1)
            self.nbytes.append(nccl_message_bytes(args))
        else:
            self.group.append(-1)
            self.seq.append(-1)
            self.nbytes.append(-1)


def read_kineto(path: Path, classifier: KernelClassifier | None = None) -> RankTable:
    """Parse one Kineto trace (.json or .json.gz). Raises TraceInputError for anything that is not one."""
    stream = TraceEventStream(path, allow_cut=True)
    kept = _Collected(classifier or KernelClassifier())
    try:
        for event in stream.events():
            if type(event) is dict and event.get("ph") == "X":
                kept.add(event)
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, TraceInputError):
            raise
        raise TraceInputError(
            path, f"event {stream.events_read + 1} of traceEvents lacks a valid {err} (not a Kineto trace?)"
        ) from None
    meta = stream.metadata
    if not stream.has_trace_events:
        raise TraceInputError(path, "not a trace: the JSON document has no traceEvents array")
    if not any(marker in meta for marker in KINETO_MARKERS):
        raise TraceInputError(
            path,
            "a Chrome trace without Kineto's markers (schemaVersion, distributedInfo, deviceProperties): not a"
            " PyTorch profiler trace; skipped",
        )
    rank, world_size, warnings = trace_rank(meta, path)
    base_ns = meta.get("baseTimeNanoseconds")
    offset = int(base_ns) if isinstance(base_ns, int) else 0
    # No GPU event at all: a CPU-only run (gloo). Its truth is in the CPU threads, read in a second pass so that
    # GPU traces never keep their CPU events.
    cpu_only = len(kept.start) == 0
    table = read_cpu_table(path, rank, offset) if cpu_only else _build_table(path, rank, kept, offset)
    table.world_size = world_size
    table.warnings = warnings + table.warnings
    if stream.cut is not None:
        table.cut = f"{path}: {stream.cut}"
        table.warnings.append(table.cut)
    return table


def _build_table(path: Path, rank: int, kept: _Collected, offset: int) -> RankTable:
    correlation = np.frombuffer(kept.correlation, dtype=np.int64)
    launched_at = _launch_times(
        correlation, np.frombuffer(kept.launch_corr, np.int64), np.frombuffer(kept.launch_ts, np.int64)
    )
    placed = assign_steps(launched_at, kept.steps, path)
    return RankTable(
        rank=rank,
        source="kineto",
        path=str(path),
        start_ns=np.frombuffer(kept.start, np.int64) + offset,
        end_ns=np.frombuffer(kept.end, np.int64) + offset,
        category=np.frombuffer(kept.category, np.int8).copy(),
        track=np.frombuffer(kept.track, np.int32).copy(),
        name_id=np.frombuffer(kept.name, np.int32).copy(),
        step=placed.step,
        group_id=np.frombuffer(kept.group, np.int32).copy(),
        seq=np.frombuffer(kept.seq, np.int64).copy(),
        in_window=placed.in_window,
        tracks=kept.tracks.values,
        names=kept.names.values,
        groups=kept.groups.values,
        complete_steps=placed.complete,
        unclassified=kept.unclassified,
        warnings=placed.warnings,
        nbytes=np.frombuffer(kept.nbytes, np.int64).copy(),
    )


def _launch_times(correlation: I64, launch_corr: I64, launch_ts: I64) -> I64:
    """For each GPU event, the time of the CPU call that launched it (int64 min when none is in the trace)."""
    out = np.full(correlation.size, NO_TIME, dtype=np.int64)
    if launch_corr.size == 0 or correlation.size == 0:
        return out
    order = np.argsort(launch_corr, kind="stable")
    keys = launch_corr[order]
    pos = np.clip(np.searchsorted(keys, correlation), 0, keys.size - 1)
    found = (keys[pos] == correlation) & (correlation >= 0)
    out[found] = launch_ts[order][pos[found]]
    return out
