"""The run-directory format: deeptrace owns it, xtrain writes it, `deeptrace analyze` and xtop read it.

Writer: `RunWriter(run_dir, rank, world_size)` (meta.json, config.toml, metrics.jsonl, ranks/rank-{R}.jsonl);
spans and heartbeats come from `deeptrace.collect.Collector`. Readers: `read_meta`, `read_metrics`,
`read_rank_records`, `read_heartbeats`, `read_rank_clock`, and `JsonlFollower` for growing files; where a rank
is, from its heartbeat: `rank_position`. Paths: `layout`.
Every file and field is specified in docs/run-directory.md.
"""

from deeptrace.rundir import layout
from deeptrace.rundir.jsonl import JsonlFollower, read_jsonl
from deeptrace.rundir.layout import FORMAT_VERSION, discover_ranks
from deeptrace.rundir.position import RankPosition, rank_position
from deeptrace.rundir.readers import (
    read_config_toml,
    read_heartbeat,
    read_heartbeats,
    read_meta,
    read_metrics,
    read_rank_clock,
    read_rank_records,
)
from deeptrace.rundir.records import ClockRef, CollectiveMark, Heartbeat, PhaseMark, RankClock, RunMeta, SpanMark
from deeptrace.rundir.writer import RunDirectoryError, RunWriter

__all__ = [
    "FORMAT_VERSION",
    "ClockRef",
    "CollectiveMark",
    "Heartbeat",
    "JsonlFollower",
    "PhaseMark",
    "RankClock",
    "RankPosition",
    "RunDirectoryError",
    "RunMeta",
    "RunWriter",
    "SpanMark",
    "discover_ranks",
    "layout",
    "rank_position",
    "read_config_toml",
    "read_heartbeat",
    "read_heartbeats",
    "read_jsonl",
    "read_meta",
    "read_metrics",
    "read_rank_clock",
    "read_rank_records",
]
