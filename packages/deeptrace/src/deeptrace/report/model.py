"""report.json as one typed model: what the analyser builds and what every reader reads.

`build_report` (report/schema.py) makes a `Report`; the terminal, Markdown and PNG renderers, the --fail-on
rules and xtop read its attributes, never string keys. `load_report(data, path)` is the one way to read a
report.json written earlier: it checks `schema` and `schema_version` (a newer version is refused with a message
to upgrade, an older one the model cannot read likewise) and validates every field. Field meanings and units:
docs/deeptrace.md ("report.json").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from deeptrace.rundir.position import brief_position, collective_text, describe_position

SCHEMA = "deeptrace.report"
SCHEMA_VERSION = 1


class _Model(BaseModel):
    # Fields may be added within a version: a reader ignores what it does not know (and keeps it on a round trip).
    model_config = ConfigDict(extra="allow", frozen=True)


class Window(_Model):
    window_ms: float
    compute_ms: float
    comm_ms: float
    exposed_comm_ms: float
    memory_ms: float
    other_ms: float
    idle_ms: float
    overlap_pct: float | None = None
    compute_pct: float | None = None
    exposed_comm_pct: float | None = None
    memory_pct: float | None = None
    other_pct: float | None = None
    idle_pct: float | None = None

    def part_ms(self, part: str) -> float:
        """compute, exposed_comm, memory, other or idle, in ms."""
        value: float = getattr(self, f"{part}_ms")
        return value


class StepWindow(Window):
    step: int | None


class RankCollectives(_Model):
    count: int
    matched: int
    arrived_last: int
    last_arrival_share: float | None
    caused_wait_ms: float
    waited_ms: float


class KindExposure(_Model):
    """One kind (all_gather, reduce_scatter, all_reduce, all_to_all, p2p, other) or purpose of collective on a
    rank: over the analysis window, and the mean per complete step with its share of the mean step window."""

    count: int
    bytes: int | None  # null where the input gives no sizes
    total_ms: float
    exposed_ms: float
    exposed_ms_per_step: float | None
    exposed_pct_of_step: float | None


@dataclass(frozen=True, slots=True)
class KindAcrossRanks:
    """One kind (or purpose) of collective over every rank that has it: what the reports show in one row.

    Means are over those ranks; the per-step figures over the ranks with complete steps."""

    kind: str
    ranks: int
    count: float  # per rank
    bytes: float | None  # per rank; None where no rank's input gives sizes
    exposed_ms_per_step: float | None
    exposed_pct_of_step: float | None
    worst_rank: int | None  # the rank with the most exposed time per step
    worst_exposed_ms_per_step: float | None


class RankReport(_Model):
    source: Literal["kineto", "collector"]
    path: str
    timing: str
    timing_note: str | None = None
    overlap_pct: float | None
    exposed_comm_ms_per_step: float | None
    breakdown: Window
    steps: list[StepWindow]
    kernels: dict[str, int]
    unclassified_kernels: dict[str, int]
    clock_offset_ms: float
    collectives: RankCollectives
    collective_kinds: dict[str, KindExposure] = Field(default_factory=dict)
    collective_purposes: dict[str, KindExposure] = Field(default_factory=dict)  # collector names only


class InputStatus(_Model):
    """One file read: a trace (kind kineto, collector), or a record file (metrics, rank_records, heartbeat)."""

    path: str
    kind: str
    rank: int | None
    error: str | None  # why the file was not used
    cut: str | None = None  # the file was cut off mid-record (a writer that died): where, and what was read
    records: int | None = None  # record files: the whole records read (step records; 1 for a heartbeat)
    last_step: int | None = None  # record files: the step of the last whole record


class EarlierAttempt(_Model):
    """A restarted rank's set-aside trace (rank-R.attempt-K.dtr): listed, not analysed as the rank."""

    rank: int
    attempt: int
    path: str


class Skew(_Model):
    median: float | None
    p95: float | None
    max: float | None


class CollectiveSkew(_Model):
    skew_ms: float | None
    last_rank: int
    group: str
    step: int | None
    name: str
    matched_by: Literal["seq", "order"]
    seq: int | None = None
    order: int | None = None


class Collectives(_Model):
    matched: int
    matched_by: dict[str, int]
    skew_ms: Skew
    per_collective: list[CollectiveSkew]
    per_collective_truncated: bool
    worst: list[CollectiveSkew]


class Clock(_Model):
    applied: bool
    reference_rank: int | None
    method: str
    offsets_ms: dict[str, float]


class StragglerCulprit(_Model):
    rank: int
    last_arrival_share: float
    arrived_last: int
    collectives: int
    mean_lateness_ms: float
    caused_wait_ms: float
    steps_recurring: int
    steps_total: int
    evidence: str


class WaitingRank(_Model):
    rank: int
    waited_ms: float


class Stragglers(_Model):
    verdict: Literal["straggler", "none", "unknown"]
    culprits: list[StragglerCulprit]
    waiting_ranks: list[WaitingRank]
    matched_collectives: int
    explanation: str


class HangCollective(_Model):
    """A collective as heartbeats name it: its process group, its sequence number there, its name."""

    group: str
    seq: int
    name: str

    def __str__(self) -> str:
        return collective_text(self.name, self.group, self.seq)


HangRankStatus = Literal["progressing", "stalled", "gone", "crashed", "closed", "missing", "unreadable"]


class HangRank(_Model):
    """One rank as the hang diagnosis sees it, from its heartbeat: report.json's `hang.ranks` values."""

    rank: int
    status: HangRankStatus
    step: int | None = None
    idle_s: float | None = None  # seconds since its last progress (span, collective, step)
    heartbeat_age_s: float | None = None  # seconds since its heartbeat file was last rewritten
    in_collective: HangCollective | None = None
    open_span: str | None = None  # "'name' (category)" of the innermost open span
    open_span_s: float | None = None  # how long it has been inside that collective, else that span
    last_seq: dict[str, int | None] = Field(default_factory=dict)  # group -> last sequence number entered
    host: str | None = None
    pid: int | None = None
    note: str | None = None  # crash message, or why the heartbeat could not be read
    stalled: bool = False  # alive without progress for the threshold (now, or before its process disappeared)

    def where(self) -> str:
        """Where the rank is, in words: step, what it is inside, for how long."""
        collective = None if self.in_collective is None else str(self.in_collective)
        return describe_position(self.step, collective, self.open_span, self.open_span_s)

    def brief(self) -> str | None:
        """Where the rank is, as a table cell: the collective it is inside, else its open span."""
        c = self.in_collective
        return brief_position(None if c is None else (c.name, c.group, c.seq), None, self.open_span)


class WatchCulprit(_Model):
    rank: int
    where: str | None
    function: str | None
    evidence: list[str]


class WatchVerdict(_Model):
    """The newest verdict of `deeptrace watch` in RUN_DIR/deeptrace/hang-*/ (stacks, file:line)."""

    path: str
    created: str | None
    summary: str | None
    culprit_ranks: list[int]
    culprits: list[WatchCulprit]
    hangs_recorded: int


class Hang(_Model):
    summary: str
    now_wall_s: float
    stall_after_s: float
    world_size: int
    stopped_ranks: list[int]
    waiting_ranks: list[int]
    culprit_ranks: list[int]
    collective: HangCollective | None
    reason: str
    missing_ranks: list[int]
    unreadable_ranks: dict[str, str]
    evidence: list[str]
    ranks: dict[str, HangRank]  # per rank, the heartbeat's account (docs/run-directory.md)
    watch: WatchVerdict | None = None

    def ranks_sorted(self) -> list[HangRank]:
        return sorted(self.ranks.values(), key=lambda state: state.rank)

    def role(self, rank: int) -> str:
        """ "culprit" (the others wait for it), "waits", or "" (neither)."""
        return "culprit" if rank in self.culprit_ranks else "waits" if rank in self.waiting_ranks else ""


class FlightDisagreement(_Model):
    group: str
    seq: int
    kind: Literal["missing", "mismatch"]
    culprit_ranks: list[int]
    per_rank: dict[str, str]
    issued_at: str | None
    summary: str


class FlightRecorder(_Model):
    """What the PyTorch Flight Recorder dumps in RUN_DIR/flight_recorder/ say (analysis/flight_recorder.py)."""

    ranks: list[int]
    paths: dict[str, str]
    first_disagreement: FlightDisagreement | None
    disagreements: list[FlightDisagreement]
    summary: str


class Report(_Model):
    schema_: Literal["deeptrace.report"] = Field(alias="schema")
    schema_version: int
    deeptrace_version: str
    created: str
    run_dir: str
    inputs: list[InputStatus]
    earlier_attempts: list[EarlierAttempt] = Field(default_factory=list)
    ranks: dict[str, RankReport]
    collectives: Collectives
    clock: Clock
    stragglers: Stragglers
    hang: Hang | None
    flight_recorder: FlightRecorder | None = None
    warnings: list[str]

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    def ranks_sorted(self) -> list[tuple[int, RankReport]]:
        return sorted(((int(rank), entry) for rank, entry in self.ranks.items()), key=lambda item: item[0])

    def kinds_across_ranks(self, purposes: bool = False) -> list[KindAcrossRanks]:
        """Per kind (all_gather, ...) or, with `purposes`, per purpose (fsdp_param_gather, ...) of collective:
        the ranks' figures in one row each, in the order the analysis gives them."""
        per_kind: dict[str, list[tuple[int, KindExposure]]] = {}
        for rank, entry in self.ranks_sorted():
            for kind, figures in (entry.collective_purposes if purposes else entry.collective_kinds).items():
                per_kind.setdefault(kind, []).append((rank, figures))
        return [_across(kind, rows) for kind, rows in per_kind.items()]

    def to_json(self) -> dict[str, Any]:
        """The exact report.json object."""
        data: dict[str, Any] = self.model_dump(mode="json", by_alias=True)
        return data


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _across(kind: str, rows: list[tuple[int, KindExposure]]) -> KindAcrossRanks:
    stepped = [(rank, f.exposed_ms_per_step) for rank, f in rows if f.exposed_ms_per_step is not None]
    worst = max(stepped, key=lambda item: item[1]) if stepped else None
    return KindAcrossRanks(
        kind=kind,
        ranks=len(rows),
        count=sum(f.count for _, f in rows) / len(rows),
        bytes=_mean([float(f.bytes) for _, f in rows if f.bytes is not None]),
        exposed_ms_per_step=_mean([ms for _, ms in stepped]),
        exposed_pct_of_step=_mean([f.exposed_pct_of_step for _, f in rows if f.exposed_pct_of_step is not None]),
        worst_rank=None if worst is None else worst[0],
        worst_exposed_ms_per_step=None if worst is None else worst[1],
    )


class ReportError(ValueError):
    """A report.json that cannot be read as this version's model; the message names the file."""


def load_report(data: bytes | dict[str, Any], path: Path | str = "report.json") -> Report:
    """Read a report.json (bytes or the parsed object): schema and version checked, every field validated."""
    try:
        obj = orjson.loads(data) if isinstance(data, bytes) else data
    except orjson.JSONDecodeError as error:
        raise ReportError(f"{path}: invalid JSON ({error})") from None
    if not isinstance(obj, dict) or obj.get("schema") != SCHEMA:
        raise ReportError(f"{path}: not a deeptrace report (schema is not {SCHEMA!r})")
    version = obj.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ReportError(f"{path}: schema_version missing or not an integer")
    if version > SCHEMA_VERSION:
        raise ReportError(
            f"{path}: report schema version {version} is newer than this deeptrace reads ({SCHEMA_VERSION}): "
            "upgrade deeptrace"
        )
    if version < SCHEMA_VERSION:
        raise ReportError(f"{path}: report schema version {version} is older than {SCHEMA_VERSION}: analyse again")
    try:
        return Report.model_validate(obj)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ReportError(f"{path}: field {where}: {first['msg']} ({error.error_count()} problems)") from None
