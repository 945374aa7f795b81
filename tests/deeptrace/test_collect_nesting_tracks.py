"""Tracks from nesting: the collector chains a thread's open spans through their contexts and the writer thread
counts the chain, so depth, lanes and the heartbeat's innermost span must come out as the nesting says."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from deeptrace.collect import Collector, read_trace
from deeptrace.rundir import layout, read_heartbeats
from deeptrace.spans import Category, Span

pytestmark = pytest.mark.usefixtures("hot_path")  # each test on the C and the Python contexts


def _spans(run_dir: Path) -> dict[str, Span]:
    return {span.name: span for span in read_trace(layout.trace_path(run_dir, 0))}


def test_depth_of_every_level_lane_and_recorded_span_follows_the_open_chain(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        collector.step_begin(0)
        with collector.span("outer", Category.COMPUTE):
            with collector.span("middle", Category.COMPUTE):
                pending = collector.collective("prefetch", group="dp").begin()  # on a lane, not in the chain
                with collector.collective("inner", group="dp"):
                    now = time.monotonic_ns()
                    collector.record("timed", Category.COMPUTE, now, now + 10)  # at the depth of a span begun now
                    collector.write_heartbeat()
                    deepest = read_heartbeats(tmp_path)[0]
                collector.write_heartbeat()
                after_inner = read_heartbeats(tmp_path)[0]
            pending.end()
            with collector.span("sibling", Category.COMPUTE):
                pass
        collector.step_end(0)
        collector.write_heartbeat()
        outside = read_heartbeats(tmp_path)[0]
    tracks = {name: span.track for name, span in _spans(tmp_path).items()}
    assert tracks == {
        "outer": "main",
        "middle": "main/1",
        "prefetch": "main/async-0",
        "inner": "main/2",
        "timed": "main/3",
        "sibling": "main/1",
        "step": "steps",
    }
    assert deepest.open_span is not None and deepest.open_span.name == "inner"
    assert after_inner.open_span is not None and after_inner.open_span.name == "middle"
    assert outside.open_span is None


def test_ending_a_span_that_was_never_begun_says_so(tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        never_entered = collector.span("x", Category.COMPUTE)
        with pytest.raises(RuntimeError, match="'x', which was not started with begin"):
            never_entered.end()
        entered = collector.collective("c", group="dp")
        with entered, pytest.raises(RuntimeError, match="'c', which was not started with begin"):
            entered.end()
