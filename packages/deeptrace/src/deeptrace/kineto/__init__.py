"""PyTorch profiler (Kineto) traces: recognised by content, parsed in one streaming pass into a RankTable."""

from deeptrace.kineto.reader import KINETO_MARKERS, rank_from_file_name, read_kineto
from deeptrace.kineto.stream import TraceEventStream

__all__ = ["KINETO_MARKERS", "TraceEventStream", "rank_from_file_name", "read_kineto"]
