"""The typed records of a run directory: run metadata, heartbeats, clock references.

Each has `to_dict()` (the exact JSON written) and `from_dict(obj, path)` (validating, raising TraceInputError that
names the file and the field). Field meanings and units: docs/run-directory.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from deeptrace.errors import TraceInputError


def _get(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], path: Path, *, optional: bool = False) -> Any:
    value = obj.get(key)
    if value is None:
        if optional:
            return None
        raise TraceInputError(path, f"missing or null field '{key}'")
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is a subclass of int: never accept true/false where a number is meant.
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        expected = " or ".join(k.__name__ for k in kinds)
        raise TraceInputError(path, f"field '{key}' is {type(value).__name__}, expected {expected}")
    return value


def _number(obj: dict[str, Any], key: str, path: Path, *, optional: bool = False) -> float | None:
    value = _get(obj, key, (int, float), path, optional=optional)
    return None if value is None else float(value)


@dataclass(frozen=True, slots=True)
class RunMeta:
    """meta.json: what a run is, written once by rank 0 at start."""

    run_id: str
    start_time_unix_s: float
    world_size: int
    hosts: list[str]
    rank_hosts: dict[int, str]
    versions: dict[str, str]
    model_flops_per_token: float | None = None
    device_peak_flops: float | None = None  # per device, FLOP/s, for the run's dtype
    extras: dict[str, Any] = field(default_factory=dict)
    format_version: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "deeptrace-run",
            "format_version": self.format_version,
            "run_id": self.run_id,
            "start_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.start_time_unix_s)),
            "start_time_unix_s": self.start_time_unix_s,
            "world_size": self.world_size,
            "hosts": self.hosts,
            "rank_hosts": {str(rank): host for rank, host in sorted(self.rank_hosts.items())},
            "versions": self.versions,
            "model_flops_per_token": self.model_flops_per_token,
            "device_peak_flops": self.device_peak_flops,
            "extras": self.extras,
        }

    @classmethod
    def from_dict(cls, obj: dict[str, Any], path: Path) -> RunMeta:
        rank_hosts_raw = _get(obj, "rank_hosts", dict, path)
        try:
            rank_hosts = {int(rank): str(host) for rank, host in rank_hosts_raw.items()}
        except ValueError:
            raise TraceInputError(path, "field 'rank_hosts' must map rank numbers to host names") from None
        return cls(
            run_id=_get(obj, "run_id", str, path),
            start_time_unix_s=float(_get(obj, "start_time_unix_s", (int, float), path)),
            world_size=_get(obj, "world_size", int, path),
            hosts=[str(h) for h in _get(obj, "hosts", list, path)],
            rank_hosts=rank_hosts,
            versions={str(k): str(v) for k, v in _get(obj, "versions", dict, path).items()},
            model_flops_per_token=_number(obj, "model_flops_per_token", path, optional=True),
            device_peak_flops=_number(obj, "device_peak_flops", path, optional=True),
            extras=_get(obj, "extras", dict, path, optional=True) or {},
            format_version=_get(obj, "format_version", int, path),
        )


@dataclass(frozen=True, slots=True)
class ClockRef:
    """A wall-clock and a monotonic-clock reading taken together on one rank.

    The collector stamps spans with `time.monotonic_ns()`, which is steady but means nothing across hosts; this
    pair maps a rank's monotonic times to wall time. The pair is the tightest of several back-to-back samples, and
    `uncertainty_ns` is how long that sample took (the true offset lies within it).
    """

    wall_ns: int
    mono_ns: int
    uncertainty_ns: int

    def to_wall_ns(self, mono_ns: int) -> int:
        return mono_ns - self.mono_ns + self.wall_ns

    def to_dict(self) -> dict[str, int]:
        return {"wall_ns": self.wall_ns, "mono_ns": self.mono_ns, "uncertainty_ns": self.uncertainty_ns}

    @classmethod
    def from_dict(cls, obj: dict[str, Any], path: Path) -> ClockRef:
        return cls(
            wall_ns=_get(obj, "wall_ns", int, path),
            mono_ns=_get(obj, "mono_ns", int, path),
            uncertainty_ns=_get(obj, "uncertainty_ns", int, path),
        )

    @classmethod
    def measure(cls, samples: int = 16) -> ClockRef:
        """Read wall and monotonic clocks together `samples` times; keep the pair read in the shortest time.

        Each sample brackets the wall read between two monotonic reads; the midpoint of the bracket is the best
        guess of when the wall clock was read, and the bracket's width bounds the error.
        """
        best: ClockRef | None = None
        for _ in range(max(1, samples)):
            before = time.monotonic_ns()
            wall = time.time_ns()
            after = time.monotonic_ns()
            width = after - before
            if best is None or width < best.uncertainty_ns:
                best = cls(wall_ns=wall, mono_ns=before + width // 2, uncertainty_ns=width)
        assert best is not None
        return best


@dataclass(frozen=True, slots=True)
class RankClock:
    """trace/rank-{R}.clock.json: a rank's clock reference at the start (and, once closed, at the end) of tracing."""

    rank: int
    host: str
    pid: int
    start: ClockRef
    end: ClockRef | None = None
    format_version: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "rank": self.rank,
            "host": self.host,
            "pid": self.pid,
            "start": self.start.to_dict(),
            "end": None if self.end is None else self.end.to_dict(),
        }

    @classmethod
    def from_dict(cls, obj: dict[str, Any], path: Path) -> RankClock:
        end = _get(obj, "end", dict, path, optional=True)
        return cls(
            rank=_get(obj, "rank", int, path),
            host=_get(obj, "host", str, path),
            pid=_get(obj, "pid", int, path),
            start=ClockRef.from_dict(_get(obj, "start", dict, path), path),
            end=None if end is None else ClockRef.from_dict(end, path),
            format_version=_get(obj, "format_version", int, path),
        )


@dataclass(frozen=True, slots=True)
class CollectiveMark:
    """One collective as a heartbeat remembers it: the collective a rank last entered or last left."""

    name: str
    group: str
    seq: int
    wall_s: float  # when the rank entered (or left) it, Unix seconds

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "group": self.group, "seq": self.seq, "wall_s": self.wall_s}

    @classmethod
    def from_dict(cls, obj: dict[str, Any], path: Path) -> CollectiveMark:
        return cls(
            name=_get(obj, "name", str, path),
            group=_get(obj, "group", str, path),
            seq=_get(obj, "seq", int, path),
            wall_s=float(_get(obj, "wall_s", (int, float), path)),
        )


@dataclass(frozen=True, slots=True)
class SpanMark:
    """The innermost span a rank is inside when its heartbeat is written (where it is, if it hangs there)."""

    name: str
    category: str
    step: int | None
    since_wall_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "category": self.category, "step": self.step, "since_wall_s": self.since_wall_s}

    @classmethod
    def from_dict(cls, obj: dict[str, Any], path: Path) -> SpanMark:
        return cls(
            name=_get(obj, "name", str, path),
            category=_get(obj, "category", str, path),
            step=_get(obj, "step", int, path, optional=True),
            since_wall_s=float(_get(obj, "since_wall_s", (int, float), path)),
        )


@dataclass(frozen=True, slots=True)
class PhaseMark:
    """A legitimately long phase the training loop announced (`Collector.phase`): a checkpoint save, an evaluation.

    A rank inside one makes no progress for a while on purpose; `deeptrace watch` never calls that a hang.
    """

    name: str
    since_wall_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "since_wall_s": self.since_wall_s}

    @classmethod
    def from_dict(cls, obj: dict[str, Any], path: Path) -> PhaseMark:
        return cls(name=_get(obj, "name", str, path), since_wall_s=float(_get(obj, "since_wall_s", (int, float), path)))


HeartbeatState = Literal["running", "closed", "crashed"]
HEARTBEAT_STATES: tuple[HeartbeatState, ...] = ("running", "closed", "crashed")


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """heartbeat/rank-{R}.json: where a rank is, rewritten atomically while it runs.

    Two times answer two questions: `written_wall_s` advances while the process lives (a daemon thread rewrites the
    file even when the training thread is blocked), `last_event_wall_s` advances only while the rank makes progress
    (steps, spans, collectives). A hung rank has a fresh `written_wall_s` and an old `last_event_wall_s`; a dead
    rank has both old.
    """

    rank: int
    world_size: int
    host: str
    pid: int
    state: HeartbeatState
    written_wall_s: float
    last_event_wall_s: float
    step: int | None  # last step begun
    step_done: int | None  # last step ended
    open_span: SpanMark | None
    collective_entered: CollectiveMark | None
    collective_left: CollectiveMark | None
    # Per process group: the sequence number of the last collective entered and left there.
    groups: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    error: str | None = None  # set when state == "crashed": the exception that ended the rank
    format_version: int = 1
    phase: PhaseMark | None = None  # the announced long phase the rank is in (innermost), if any
    # The training thread (the one that made the Collector): `threading.get_ident()`, which is the pthread id that
    # py-spy's `thread_id` and faulthandler's "Thread 0x..." lines show, so a stack dump finds that thread.
    thread_id: int | None = None
    stack_signal: int | None = None  # the signal that makes the rank dump its stacks (Collector's in-process dump)

    @property
    def in_collective(self) -> CollectiveMark | None:
        """The collective the rank is inside now (entered and not yet left), if any."""
        entered, left = self.collective_entered, self.collective_left
        if entered is None:
            return None
        if left is not None and left.group == entered.group and left.seq == entered.seq:
            return None
        return entered

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "rank": self.rank,
            "world_size": self.world_size,
            "host": self.host,
            "pid": self.pid,
            "state": self.state,
            "written_wall_s": self.written_wall_s,
            "last_event_wall_s": self.last_event_wall_s,
            "step": self.step,
            "step_done": self.step_done,
            "open_span": None if self.open_span is None else self.open_span.to_dict(),
            "collective_entered": None if self.collective_entered is None else self.collective_entered.to_dict(),
            "collective_left": None if self.collective_left is None else self.collective_left.to_dict(),
            "groups": {g: {"entered": e, "left": left} for g, (e, left) in sorted(self.groups.items())},
            "error": self.error,
            "phase": None if self.phase is None else self.phase.to_dict(),
            "thread_id": self.thread_id,
            "stack_signal": self.stack_signal,
        }

    @classmethod
    def from_dict(cls, obj: dict[str, Any], path: Path) -> Heartbeat:
        state = _get(obj, "state", str, path)
        if state not in HEARTBEAT_STATES:
            raise TraceInputError(path, f"field 'state' is {state!r}, expected one of {HEARTBEAT_STATES}")
        groups: dict[str, tuple[int | None, int | None]] = {}
        for group, marks in (_get(obj, "groups", dict, path, optional=True) or {}).items():
            if not isinstance(marks, dict):
                raise TraceInputError(path, f"field 'groups.{group}' must be an object")
            groups[str(group)] = (
                _get(marks, "entered", int, path, optional=True),
                _get(marks, "left", int, path, optional=True),
            )
        span = _get(obj, "open_span", dict, path, optional=True)
        entered = _get(obj, "collective_entered", dict, path, optional=True)
        left = _get(obj, "collective_left", dict, path, optional=True)
        phase = _get(obj, "phase", dict, path, optional=True)
        return cls(
            rank=_get(obj, "rank", int, path),
            world_size=_get(obj, "world_size", int, path),
            host=_get(obj, "host", str, path),
            pid=_get(obj, "pid", int, path),
            state=state,  # checked against HEARTBEAT_STATES above
            written_wall_s=float(_get(obj, "written_wall_s", (int, float), path)),
            last_event_wall_s=float(_get(obj, "last_event_wall_s", (int, float), path)),
            step=_get(obj, "step", int, path, optional=True),
            step_done=_get(obj, "step_done", int, path, optional=True),
            open_span=None if span is None else SpanMark.from_dict(span, path),
            collective_entered=None if entered is None else CollectiveMark.from_dict(entered, path),
            collective_left=None if left is None else CollectiveMark.from_dict(left, path),
            groups=groups,
            error=_get(obj, "error", str, path, optional=True),
            format_version=_get(obj, "format_version", int, path),
            phase=None if phase is None else PhaseMark.from_dict(phase, path),
            thread_id=_get(obj, "thread_id", int, path, optional=True),
            stack_signal=_get(obj, "stack_signal", int, path, optional=True),
        )
