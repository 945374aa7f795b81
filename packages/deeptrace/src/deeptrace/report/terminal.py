"""The readable terminal report (rich), made from the typed report alone."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from deeptrace.report.model import Hang, HangRank, KindAcrossRanks, RankReport, Report

MAX_STEPS_PER_RANK = 20
MAX_ARRIVAL_ROWS = 32
MAX_STEP_ROWS = 64  # beyond this the terminal shows a pointer; the files have every step
MAX_HANG_ROWS = 16  # ranks of a hang shown: culprits first, then the waiting, then the rest


def hang_rows(hang: Hang, limit: int | None) -> list[HangRank]:
    """The ranks of a hang in the order worth reading: culprits, waiting ranks, the others; at most `limit`."""
    first = {rank: i for i, rank in enumerate([*hang.culprit_ranks, *hang.waiting_ranks])}
    ordered = sorted(hang.ranks.values(), key=lambda state: (first.get(state.rank, len(first)), state.rank))
    return ordered if limit is None else ordered[:limit]


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.2f}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}%"


def render_terminal(report: Report, console: Console) -> None:
    ranks = report.ranks_sorted()
    console.print(f"[bold]deeptrace[/bold] {report.run_dir}  ({len(ranks)} ranks analysed)")
    table = Table(title="Per rank: analysis window (times in ms)", title_justify="left")
    for header in ("rank", "overlap", "exposed/step", "compute", "comm", "exposed", "memory", "idle", "window",
                   "offset"):  # fmt: skip
        table.add_column(header, justify="right")
    for rank, r in ranks:
        b = r.breakdown
        table.add_row(
            str(rank),
            _pct(r.overlap_pct),
            _ms(r.exposed_comm_ms_per_step),
            _ms(b.compute_ms),
            _ms(b.comm_ms),
            _ms(b.exposed_comm_ms),
            _ms(b.memory_ms),
            _ms(b.idle_ms),
            _ms(b.window_ms),
            _ms(r.clock_offset_ms),
        )
    if ranks:
        console.print(table)
    for rank, r in ranks:
        if r.timing_note:
            console.print(f"rank {rank}: {r.timing_note}")
    for earlier in report.earlier_attempts:
        console.print(f"rank {earlier.rank}: earlier attempt {earlier.attempt} set aside, not analysed: {earlier.path}")

    rows = sum(min(len(r.steps), MAX_STEPS_PER_RANK) for _, r in ranks)
    if not ranks:
        pass  # nothing per rank to show (only heartbeats or Flight Recorder dumps)
    elif rows > MAX_STEP_ROWS:
        console.print(f"Per-step figures of {len(ranks)} ranks: in report.json and report.md.")
    else:
        _steps_table(ranks, console)
    _kinds(report, console)
    _collectives(report, console)


def kind_cells(row: KindAcrossRanks) -> list[str]:
    """A kind's row, shared by the terminal and Markdown reports (see KIND_COLUMNS)."""
    worst = "—" if row.worst_rank is None else f"{_ms(row.worst_exposed_ms_per_step)} (rank {row.worst_rank})"
    return [
        row.kind,
        str(row.ranks),
        f"{row.count:,.1f}",
        "—" if row.bytes is None else f"{row.bytes / 2**20:,.1f} MiB",
        _ms(row.exposed_ms_per_step),
        _pct(row.exposed_pct_of_step),
        worst,
    ]


KIND_COLUMNS = ("ranks", "count/rank", "bytes/rank", "exposed ms/step", "of step", "most exposed (rank)")


def _kinds(report: Report, console: Console) -> None:
    """Exposed communication per kind and per purpose of collective, averaged over the ranks."""
    for purposes, title in ((False, "kind"), (True, "purpose")):
        rows = report.kinds_across_ranks(purposes)
        if not rows:
            continue
        table = Table(title=f"Exposed communication per {title} of collective (mean over ranks, per step)",
                      title_justify="left")  # fmt: skip
        for header in (title, *KIND_COLUMNS):
            table.add_column(header, justify="left" if header == title else "right")
        for row in rows:
            table.add_row(*kind_cells(row))
        console.print(table)


def _steps_table(ranks: list[tuple[int, RankReport]], console: Console) -> None:
    steps = Table(title="Per rank and step (ms)", title_justify="left")
    for header in ("rank", "step", "window", "compute", "exposed comm", "memory", "idle", "overlap"):
        steps.add_column(header, justify="right")
    for rank, r in ranks:
        for s in r.steps[:MAX_STEPS_PER_RANK]:
            steps.add_row(
                str(rank),
                "—" if s.step is None else str(s.step),
                _ms(s.window_ms),
                _ms(s.compute_ms),
                _ms(s.exposed_comm_ms),
                _ms(s.memory_ms),
                _ms(s.idle_ms),
                _pct(s.overlap_pct),
            )
    console.print(steps)


def _collectives(report: Report, console: Console) -> None:
    ranks = report.ranks_sorted()
    coll = report.collectives
    if coll.matched:
        skew = coll.skew_ms
        console.print(
            f"[bold]Collectives[/bold]: {coll.matched} matched across ranks "
            f"(by sequence number: {coll.matched_by.get('seq', 0)}, by order: {coll.matched_by.get('order', 0)}); "
            f"arrival skew median {_ms(skew.median)} ms, p95 {_ms(skew.p95)} ms, max {_ms(skew.max)} ms"
        )
        arrivals = Table(title="Arrivals at matched collectives", title_justify="left")
        for header in ("rank", "collectives", "arrived last", "share", "others waited for it (ms)", "it waited (ms)"):
            arrivals.add_column(header, justify="right")
        shown = sorted(ranks, key=lambda kv: -kv[1].collectives.caused_wait_ms)[:MAX_ARRIVAL_ROWS]
        if len(ranks) > MAX_ARRIVAL_ROWS:
            arrivals.caption = f"the {MAX_ARRIVAL_ROWS} ranks that caused the most waiting; all in report.json"
        for rank, r in sorted(shown, key=lambda kv: kv[0]):
            c = r.collectives
            if c.matched:
                arrivals.add_row(
                    str(rank), str(c.matched), str(c.arrived_last), _pct(100 * (c.last_arrival_share or 0)),
                    _ms(c.caused_wait_ms), _ms(c.waited_ms),
                )  # fmt: skip
        console.print(arrivals)
    s = report.stragglers
    colour = {"straggler": "red", "none": "green"}.get(s.verdict, "yellow")
    console.print(f"[bold]Stragglers[/bold]: [{colour}]{s.verdict}[/{colour}] — {s.explanation}")
    _findings(report, console)


def _findings(report: Report, console: Console) -> None:
    """The hang (heartbeats, and deeptrace watch's stacks), the Flight Recorder, the warnings."""
    hang = report.hang
    if hang is not None:
        console.print(f"[bold red]Hang[/bold red]: {hang.summary}")
        table = Table(title="Where each rank is (heartbeats)", title_justify="left")
        for header in ("rank", "role", "status", "where", "idle (s)"):
            table.add_column(header, justify="right" if header in ("rank", "idle (s)") else "left")
        for state in hang_rows(hang, MAX_HANG_ROWS):
            role = hang.role(state.rank)
            idle = "—" if state.idle_s is None else f"{state.idle_s:,.1f}"
            table.add_row(str(state.rank), role, state.status, state.where(), idle, style="red" * (role == "culprit"))
        if len(hang.ranks) > MAX_HANG_ROWS:
            table.caption = f"{MAX_HANG_ROWS} of {len(hang.ranks)} ranks; all in report.json and report.md"
        console.print(table)
        if hang.watch is not None:
            for culprit in hang.watch.culprits:
                console.print(f"  deeptrace watch: rank {culprit.rank} waits at {culprit.where} ({culprit.function})")
                for line in culprit.evidence:
                    console.print(f"    {line}")
            console.print(f"  stacks and verdict: {Path(hang.watch.path).parent}")
    flight = report.flight_recorder
    if flight is not None:
        console.print(f"[bold]Flight Recorder[/bold]: {flight.summary}")
        first = flight.first_disagreement
        if first is not None:
            for who, what in sorted(first.per_rank.items(), key=lambda kv: int(kv[0])):
                console.print(f"  rank {who}: {what}")
            if first.issued_at:
                console.print(f"  issued at {first.issued_at}")
    if report.warnings:
        # The warnings themselves went to stderr as they arose; repeating them here would say each one twice.
        console.print(f"[yellow]{len(report.warnings)} warnings[/yellow] (on stderr above, and in report.json)")
