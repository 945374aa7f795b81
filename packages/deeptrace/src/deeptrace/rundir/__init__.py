"""The run-directory format: deeptrace owns it, xtrain writes it, `deeptrace analyze` and xtop read it.

Writer: `RunWriter(run_dir, rank, world_size)` (meta.json, config.toml, metrics.jsonl as `StepRecord`s,
ranks/rank-{R}.jsonl as `RankStepRecord`s); spans and heartbeats come from `deeptrace.collect.Collector`.
Readers: `read_meta`, `read_metrics`, `read_rank_records`, `read_heartbeats`, `read_rank_clock`, and
`follow_metrics` / `follow_rank_records` (typed) or `JsonlFollower` for growing files (a file cut off mid-line by
a writer that died is read up to its last whole record, and the cut named by a `CutOffError`); where a rank is,
from its heartbeat: `rank_position`. Paths: `layout`.
Every file and field is specified in docs/run-directory.md.
"""

from deeptrace.errors import CutOffError
from deeptrace.rundir import layout
from deeptrace.rundir.jsonl import JsonlFollower, RecordFollower, read_jsonl
from deeptrace.rundir.layout import FORMAT_VERSION, discover_ranks
from deeptrace.rundir.position import RankPosition, rank_position
from deeptrace.rundir.readers import (
    follow_metrics,
    follow_rank_records,
    rank_records_files,
    read_config_toml,
    read_heartbeat,
    read_heartbeats,
    read_meta,
    read_metrics,
    read_rank_clock,
    read_rank_records,
)
from deeptrace.rundir.records import ClockRef, CollectiveMark, Heartbeat, PhaseMark, RankClock, RunMeta, SpanMark
from deeptrace.rundir.step_records import CommLinkBytes, RankStepRecord, StepRecord
from deeptrace.rundir.writer import RunDirectoryError, RunWriter

__all__ = [
    "FORMAT_VERSION",
    "ClockRef",
    "CollectiveMark",
    "CommLinkBytes",
    "CutOffError",
    "Heartbeat",
    "JsonlFollower",
    "PhaseMark",
    "RankClock",
    "RankPosition",
    "RankStepRecord",
    "RecordFollower",
    "RunDirectoryError",
    "RunMeta",
    "RunWriter",
    "SpanMark",
    "StepRecord",
    "discover_ranks",
    "follow_metrics",
    "follow_rank_records",
    "layout",
    "rank_position",
    "rank_records_files",
    "read_config_toml",
    "read_heartbeat",
    "read_heartbeats",
    "read_jsonl",
    "read_meta",
    "read_metrics",
    "read_rank_clock",
    "read_rank_records",
]
