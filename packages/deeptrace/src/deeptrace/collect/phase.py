"""Announced long phases (`Collector.phase`): a checkpoint save, an evaluation, data preparation.

Such a phase can take minutes without a step, a collective or a span ending, which from the outside looks like a
hang. The training loop says so instead: the phase goes into the heartbeat while it lasts, so `deeptrace watch`
shows the rank as busy in that phase and never raises an alarm for it, and into the trace as a span.
"""

from __future__ import annotations

from time import monotonic_ns
from typing import TYPE_CHECKING

from deeptrace.spans import Category

if TYPE_CHECKING:
    from deeptrace.collect.collector import Collector
    from deeptrace.collect.contexts import SpanContext

_CATEGORY_BY_PREFIX = (("checkpoint", Category.CHECKPOINT), ("data", Category.DATA), ("eval", Category.OTHER))


def phase_category(name: str) -> Category:
    """The span category of a phase, from its name (checkpoint*, data*, anything else: OTHER)."""
    lowered = name.lower()
    return next((category for prefix, category in _CATEGORY_BY_PREFIX if lowered.startswith(prefix)), Category.OTHER)


class PhaseContext:
    """`with collector.phase(name)`: announced in the heartbeat while inside, recorded as a span."""

    __slots__ = ("_span", "collector", "name", "start_ns")

    def __init__(self, collector: Collector, name: str, category: Category) -> None:
        self.collector = collector
        self.name = name
        self.start_ns = 0
        self._span: SpanContext = collector.span(name, category)

    def __enter__(self) -> PhaseContext:
        live = self.collector._live
        self._span.__enter__()
        self.start_ns = monotonic_ns()
        live.phases.append(self)
        live.last_event_ns = self.start_ns  # entering a phase is progress: its clock starts now
        self.collector._heartbeat.wake()  # announce it soon, not at the next interval
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        live = self.collector._live
        if self in live.phases:
            live.phases.remove(self)
        self._span.__exit__(exc_type, exc, tb)
        live.last_event_ns = monotonic_ns()
        self.collector._heartbeat.wake()
