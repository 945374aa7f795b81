"""The span collector and its trace files.

`Collector(run_dir, rank, world_size)` records spans, collectives and steps into RUN_DIR/trace/rank-{R}.dtr (with
the rank's clock reference in rank-{R}.clock.json) and keeps RUN_DIR/heartbeat/rank-{R}.json current.
`read_trace(path)` iterates a trace file's Spans, `read_trace_columns(path)` reads it into numpy columns (fast);
`trace_paths(run_dir)` finds every rank's trace.
"""

from deeptrace.collect.collector import Collector
from deeptrace.collect.columns import SPAN_DTYPE, TraceColumns, read_trace_columns
from deeptrace.collect.contexts import CollectiveContext, SpanContext
from deeptrace.collect.reader import TraceReader, read_trace, trace_paths
from deeptrace.collect.trace_format import STEP_SPAN_NAME, STEP_TRACK

__all__ = [
    "SPAN_DTYPE",
    "STEP_SPAN_NAME",
    "STEP_TRACK",
    "CollectiveContext",
    "Collector",
    "SpanContext",
    "TraceColumns",
    "TraceReader",
    "read_trace",
    "read_trace_columns",
    "trace_paths",
]
