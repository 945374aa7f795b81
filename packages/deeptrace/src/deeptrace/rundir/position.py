"""Where a rank is, from its heartbeat: its step, the collective it is inside, its innermost open span, the long
phase it announced, and since when. The one reading of a heartbeat's position, and the one wording of it, for
`deeptrace analyze`'s hang diagnosis (report.json's `hang.ranks`), `deeptrace watch` and xtop.

Two wordings: `describe` is the sentence of a report ("step 7, inside all_reduce (group dp, seq 42), for 3.0 min"),
`brief` the cell of a table ("in all_reduce (dp #42)", "phase checkpoint", "in forward").
"""

from __future__ import annotations

from dataclasses import dataclass

from deeptrace.rundir.records import CollectiveMark, Heartbeat, PhaseMark, SpanMark


@dataclass(frozen=True, slots=True)
class RankPosition:
    """A rank's position as its heartbeat gives it."""

    step: int | None  # the last step begun
    collective: CollectiveMark | None  # the collective it is inside now (entered, not left)
    span: SpanMark | None  # the innermost span it is inside
    phase: PhaseMark | None  # the announced long phase it is in (innermost)

    @property
    def since_wall_s(self) -> float | None:
        """When it entered where it is (Unix seconds): the collective, else the open span; None outside both."""
        if self.collective is not None:
            return self.collective.wall_s
        if self.span is not None:
            return self.span.since_wall_s
        return None

    @property
    def span_label(self) -> str | None:
        """The open span as "'name' (category)"."""
        return None if self.span is None else f"'{self.span.name}' ({self.span.category})"

    def inside_for_s(self, now_wall_s: float) -> float | None:
        """How long it has been inside its collective (else its open span) at `now_wall_s`."""
        since = self.since_wall_s
        return None if since is None else now_wall_s - since

    def describe(self, now_wall_s: float | None = None) -> str:
        """The sentence: step, what it is inside, and (given `now_wall_s`) for how long."""
        c = self.collective
        return describe_position(
            self.step,
            None if c is None else collective_text(c.name, c.group, c.seq),
            self.span_label,
            None if now_wall_s is None else self.inside_for_s(now_wall_s),
        )

    def brief(self) -> str | None:
        """The table cell: the collective it is inside, else its announced phase, else its open span."""
        c = self.collective
        return brief_position(
            None if c is None else (c.name, c.group, c.seq),
            None if self.phase is None else self.phase.name,
            None if self.span is None else self.span.name,
        )


def rank_position(heartbeat: Heartbeat) -> RankPosition:
    """Where the rank of `heartbeat` is."""
    return RankPosition(
        step=heartbeat.step, collective=heartbeat.in_collective, span=heartbeat.open_span, phase=heartbeat.phase
    )


def collective_text(name: str, group: str, seq: int) -> str:
    return f"{name} (group {group}, seq {seq})"


def describe_position(step: int | None, collective: str | None, span: str | None, inside_for_s: float | None) -> str:
    """The sentence of a position from its parts (also what a stored report.json rank gives back)."""
    parts = []
    if step is not None:
        parts.append(f"step {step}")
    inside = collective if collective is not None else span
    if inside is not None:
        parts.append(f"inside {inside}")
        if inside_for_s is not None:
            parts.append(f"for {duration_text(inside_for_s)}")
    return ", ".join(parts) if parts else "position unknown"


def brief_position(collective: tuple[str, str, int] | None, phase: str | None, span: str | None) -> str | None:
    """The table cell of a position from its parts; None when the rank is inside nothing."""
    if collective is not None:
        name, group, seq = collective
        return f"in {name} ({group} #{seq})"
    if phase is not None:
        return f"phase {phase}"
    if span is not None:
        return f"in {span}"
    return None


def duration_text(seconds: float) -> str:
    """Seconds, minutes or hours, whichever reads best."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
