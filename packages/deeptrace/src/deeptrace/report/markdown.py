"""report.md: the same content as the terminal report, as Markdown tables, from the typed report."""

from __future__ import annotations

from deeptrace.report.model import Hang, Report
from deeptrace.report.terminal import KIND_COLUMNS, hang_rows, kind_cells

MAX_KIND_RANKS = 32  # per-rank rows of the kinds table up to this many ranks; report.json has them all


def _f(value: float | None, suffix: str = "") -> str:
    return "—" if value is None else f"{value:,.2f}{suffix}"


def render_markdown(report: Report, png_name: str | None = None) -> str:
    ranks = report.ranks_sorted()
    lines = [
        f"# deeptrace report: {report.run_dir}",
        "",
        f"Schema {report.schema_} v{report.schema_version}, deeptrace {report.deeptrace_version},"
        f" created {report.created}.",
        "",
    ]
    if png_name:
        lines += [f"![summary]({png_name})", ""]
    lines += [
        "## Per rank (analysis window, ms)",
        "",
        "| rank | source | overlap | exposed comm / step | compute | comm | exposed comm | memory | idle | window |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rank, r in ranks:
        b = r.breakdown
        source = r.source + (" (CPU)" if r.timing == "cpu" else "")
        lines.append(
            f"| {rank} | {source} | {_f(r.overlap_pct, '%')} | {_f(r.exposed_comm_ms_per_step)} |"
            f" {_f(b.compute_ms)} | {_f(b.comm_ms)} | {_f(b.exposed_comm_ms)} | {_f(b.memory_ms)} |"
            f" {_f(b.idle_ms)} | {_f(b.window_ms)} |"
        )
    notes = [f"- rank {rank}: {r.timing_note}" for rank, r in ranks if r.timing_note]
    if notes:
        lines += ["", "How the CPU traces were read:", "", *notes]
    if report.earlier_attempts:
        lines += ["", "Earlier attempts of restarted ranks (kept aside, not analysed):", ""]
        lines += [f"- rank {e.rank}, attempt {e.attempt}: `{e.path}`" for e in report.earlier_attempts]
    lines += [
        "",
        "## Per rank and step (ms)",
        "",
        "| rank | step | window | compute | exposed comm | memory | idle | overlap |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rank, r in ranks:
        for s in r.steps:
            lines.append(
                f"| {rank} | {s.step if s.step is not None else '—'} | {_f(s.window_ms)} |"
                f" {_f(s.compute_ms)} | {_f(s.exposed_comm_ms)} | {_f(s.memory_ms)} | {_f(s.idle_ms)} |"
                f" {_f(s.overlap_pct, '%')} |"
            )
    lines += _kinds(report)
    coll = report.collectives
    lines += ["", "## Collectives and stragglers", ""]
    if coll.matched:
        sk = coll.skew_ms
        lines += [
            f"{coll.matched} collectives matched; arrival skew median {_f(sk.median)} ms,"
            f" p95 {_f(sk.p95)} ms, max {_f(sk.max)} ms.",
            "",
            "| rank | matched | arrived last | others waited for it (ms) | it waited (ms) | clock offset (ms) |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for rank, r in ranks:
            c = r.collectives
            lines.append(
                f"| {rank} | {c.matched} | {c.arrived_last} | {_f(c.caused_wait_ms)} | {_f(c.waited_ms)}"
                f" | {_f(r.clock_offset_ms)} |"
            )
        lines.append("")
    verdict = report.stragglers
    lines += [f"**Straggler verdict: {verdict.verdict}.** {verdict.explanation}", ""]
    lines += ["## Hang", "", *(_hang(report.hang)), ""]
    flight = report.flight_recorder
    if flight is not None:
        lines += ["## Flight Recorder", "", flight.summary, ""]
        if flight.first_disagreement is not None:
            first = flight.first_disagreement
            lines += [f"- rank {r}: {what}" for r, what in sorted(first.per_rank.items(), key=lambda kv: int(kv[0]))]
            lines += [f"- issued at `{first.issued_at}`" if first.issued_at else "", ""]
    lines += ["## Warnings", ""]
    lines += [f"- {w}" for w in report.warnings] or ["None."]
    return "\n".join(lines) + "\n"


def _kinds(report: Report) -> list[str]:
    """Exposed communication per kind and per purpose of collective: over the ranks, then rank by rank."""
    lines = []
    for purposes, title in ((False, "kind"), (True, "purpose")):
        rows = report.kinds_across_ranks(purposes)
        if not rows:
            continue
        lines += ["", f"## Exposed communication per {title} of collective (mean over ranks, per step)", ""]
        lines += ["| " + " | ".join((title, *KIND_COLUMNS)) + " |", "|---|" + "---:|" * len(KIND_COLUMNS)]
        lines += ["| " + " | ".join(kind_cells(row)) + " |" for row in rows]
        ranks = report.ranks_sorted()
        if len(ranks) > MAX_KIND_RANKS:
            lines += ["", f"Per rank: report.json's `collective_{title}s` ({len(ranks)} ranks)."]
            continue
        lines += ["", f"| rank | {title} | count | bytes | total (ms) | exposed (ms) | exposed / step (ms) | of step |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for rank, r in ranks:
            for kind, k in (r.collective_purposes if purposes else r.collective_kinds).items():
                size = "—" if k.bytes is None else f"{k.bytes / 2**20:,.1f} MiB"
                lines.append(f"| {rank} | {kind} | {k.count} | {size} | {_f(k.total_ms)} | {_f(k.exposed_ms)} |"
                             f" {_f(k.exposed_ms_per_step)} | {_f(k.exposed_pct_of_step, '%')} |")  # fmt: skip
    return lines


def _hang(hang: Hang | None) -> list[str]:
    if hang is None:
        return ["No hang diagnosed."]
    lines = [hang.summary, "", "| rank | role | status | where | idle (s) | note |", "|---:|---|---|---|---:|---|"]
    for state in hang_rows(hang, None):
        role = hang.role(state.rank).replace("culprit", "**culprit**")
        idle = "—" if state.idle_s is None else f"{state.idle_s:,.1f}"
        lines.append(f"| {state.rank} | {role} | {state.status} | {state.where()} | {idle} | {state.note or ''} |")
    lines += ["", "Evidence:", "", *(f"- {line}" for line in hang.evidence)]
    if hang.watch is not None:
        lines += ["", f"`deeptrace watch` read every rank's stacks (`{hang.watch.path}`):", ""]
        for culprit in hang.watch.culprits:
            lines.append(f"- **rank {culprit.rank}** waits at `{culprit.where}` in `{culprit.function}()`")
            lines += [f"  - {line}" for line in culprit.evidence]
    return lines
