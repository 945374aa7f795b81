"""`deeptrace diff`'s outputs, made from the DiffReport alone: the terminal tables (rich), diff.md and diff.png
(a bar chart of the largest changes), and diff.json."""

from __future__ import annotations

from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

from deeptrace.diff.model import DiffReport, KindRow, OpRow, Side

TERMINAL_ROWS = 20
MARKDOWN_ROWS = 50
CHART_ROWS = 15


def _us(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def _signed(value: float | None) -> str:
    return "—" if value is None else f"{value:+,.0f}"


def _bytes(value: int | None) -> str:
    return "—" if value is None else f"{value / 2**20:,.1f} MiB"


def _short(name: str, width: int = 70) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def _heading(report: DiffReport) -> str:
    def side(label: str, s: Side) -> str:
        return f"{label}: {s.path} (rank {s.rank}, steps {', '.join(map(str, s.steps)) or '—'})"

    return f"{side('A', report.a)}\n{side('B', report.b)}\nstep: {report.step}; delta = B − A; times in µs"


def _op_columns() -> tuple[str, ...]:
    return ("name", "A count", "B count", "A total", "B total", "delta")


def _op_cells(row: OpRow) -> list[str]:
    return [_short(row.name, 48), str(row.a_count), str(row.b_count), _us(row.a_total_us), _us(row.b_total_us),
            f"{row.delta_us:+,.0f}"]  # fmt: skip


def _kind_columns(title: str) -> tuple[str, ...]:
    return (title, "A count", "B count", "A bytes", "B bytes", "A total", "B total", "A exposed", "B exposed",
            "delta exposed")  # fmt: skip


def _kind_cells(kind: str, row: KindRow) -> list[str]:
    delta = f"{row.delta_exposed_us:+,.0f}"
    return [kind, str(row.a_count), str(row.b_count), _bytes(row.a_bytes), _bytes(row.b_bytes), _us(row.a_total_us),
            _us(row.b_total_us), _us(row.a_exposed_us), _us(row.b_exposed_us), delta]  # fmt: skip


_RANK_COLUMNS = ("rank", "A step", "B step", "delta step", "A exposed", "B exposed", "delta exposed")


def _rank_cells(report: DiffReport) -> list[list[str]]:
    return [[str(r.rank), _us(r.a_step_us), _us(r.b_step_us), _signed(r.delta_step_us), _us(r.a_exposed_us),
             _us(r.b_exposed_us), _signed(r.delta_exposed_us)] for r in report.ranks]  # fmt: skip


def _sections(report: DiffReport) -> list[tuple[str, tuple[str, ...], list[list[str]]]]:
    """(title, columns, rows) of every table, all rows; the renderers cut them."""
    sections = [
        ("Ops (CPU operators, annotations, GPU kernels)", _op_columns(), [_op_cells(r) for r in report.ops]),
        ("Collectives per kind (compared rank)", _kind_columns("kind"),
         [_kind_cells(k, r) for k, r in report.collectives.items()]),
    ]  # fmt: skip
    if report.purposes:
        sections.append(("Collectives per purpose (collector names)", _kind_columns("purpose"),
                         [_kind_cells(k, r) for k, r in report.purposes.items()]))  # fmt: skip
    sections.append(("Ranks: step time and exposed communication per step", _RANK_COLUMNS, _rank_cells(report)))
    sections.append(("Spans (collector)", _op_columns(), [_op_cells(r) for r in report.spans]))
    return sections


def render_terminal(report: DiffReport, console: Console) -> None:
    console.print(f"[bold]deeptrace diff[/bold]\n{_heading(report)}")
    for title, columns, rows in _sections(report):
        if not rows:
            continue
        table = Table(title=f"{title}: {len(rows)} rows, largest changes first", title_justify="left")
        for i, column in enumerate(columns):
            table.add_column(column, justify="left" if i == 0 else "right", overflow="fold")
        for cells in rows[:TERMINAL_ROWS]:
            table.add_row(*cells)
        console.print(table)
        if len(rows) > TERMINAL_ROWS:
            console.print(f"  … {len(rows) - TERMINAL_ROWS} more rows in diff.json / diff.md")


def render_markdown(report: DiffReport, png_name: str | None) -> str:
    lines = ["# deeptrace diff", "", *(f"- {line}" for line in _heading(report).splitlines()), ""]
    if png_name:
        lines += [f"![largest changes]({png_name})", ""]
    for title, columns, rows in _sections(report):
        if not rows:
            continue
        lines += [f"## {title}", "", "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in rows[:MARKDOWN_ROWS]]
        if len(rows) > MARKDOWN_ROWS:
            lines.append(f"\n{len(rows) - MARKDOWN_ROWS} more rows in diff.json.")
        lines.append("")
    if report.warnings:
        lines += ["## Warnings", "", *(f"- {w}" for w in report.warnings), ""]
    return "\n".join(lines)


def write_png(report: DiffReport, path: Path) -> None:
    """Horizontal bars of the largest changes in total time: ops, spans and exposed time per kind together."""
    import matplotlib  # noqa: PLC0415  # lazy: keeps --help and light commands fast

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    changes = [(f"op {_short(r.name, 50)}", r.delta_us) for r in report.ops]
    changes += [(f"span {_short(r.name, 50)}", r.delta_us) for r in report.spans]
    changes += [(f"exposed {k}", r.delta_exposed_us) for k, r in report.collectives.items()]
    changes = sorted((c for c in changes if c[1] != 0), key=lambda c: -abs(c[1]))[:CHART_ROWS]
    fig, ax = plt.subplots(figsize=(11, max(3.0, 0.4 * len(changes) + 1.5)), constrained_layout=True)
    labels = [c[0] for c in changes]
    values = [c[1] / 1e3 for c in changes]
    bars = ax.barh(labels, values, color=["#DD5555" if v > 0 else "#4C72B0" for v in values])
    ax.bar_label(bars, labels=[f"{v:+,.2f} ms" for v in values], padding=3, fontsize=9)
    ax.margins(x=0.25)  # room for the labels at the bars' ends
    ax.axvline(0, color="black", linewidth=0.8)
    ax.invert_yaxis()
    if not changes:
        ax.text(0.5, 0.5, "no op, span or exposed time changed", ha="center", va="center", transform=ax.transAxes)
        ax.set_yticks([])
    ax.set_xlabel("B − A, ms (red: slower in B, blue: faster)")
    steps = "first profiler step" if report.step == "first" else f"step {report.step}"
    names = f"{Path(report.a.path).name} → {Path(report.b.path).name}"  # whole paths are in diff.md
    ax.set_title(f"Largest changes, {names} ({steps}, rank {report.a.rank})", fontsize=10)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_outputs(report: DiffReport, folder: Path, png: bool) -> dict[str, Path]:
    """diff.json, diff.md and (unless png is False) diff.png in `folder`; OSError when it cannot be written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = {"json": folder / "diff.json", "markdown": folder / "diff.md"}
    written["json"].write_bytes(diff_json_bytes(report))
    if png:
        written["png"] = folder / "diff.png"
        write_png(report, written["png"])
    written["markdown"].write_text(render_markdown(report, "diff.png" if png else None), encoding="utf-8")
    return written


def diff_json_bytes(report: DiffReport) -> bytes:
    return orjson.dumps(report.model_dump(mode="json"), option=orjson.OPT_INDENT_2) + b"\n"
