"""summary.png: per-rank time breakdown bars and a timeline of one step on all ranks (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

from deeptrace.analysis.run import RunAnalysis
from deeptrace.report.model import Report

COLOURS = {"compute": "#4C72B0", "exposed_comm": "#DD5555", "memory": "#55A868", "other": "#8172B2", "idle": "#CCCCCC"}
LABELS = {"compute": "compute", "exposed_comm": "exposed comm", "memory": "memory", "other": "other", "idle": "idle"}


def write_png(report: Report, analysis: RunAnalysis, path: Path) -> None:
    import matplotlib  # noqa: PLC0415  # lazy: keeps --help and light commands fast

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415  # lazy: keeps --help and light commands fast

    ranks = [str(rank) for rank, _ in report.ranks_sorted()]
    height = min(12.0, max(3.0, 0.35 * len(ranks) + 1.5))  # hundreds of ranks: thinner bars, not a huge image
    fig, (bars, timeline) = plt.subplots(2, 1, figsize=(11, 2 * height), constrained_layout=True)

    # Mean per step, so ranks with different numbers of steps compare.
    left = [0.0] * len(ranks)
    for part, colour in COLOURS.items():
        values = []
        for rank in ranks:
            windows = report.ranks[rank].steps
            values.append(sum(w.part_ms(part) for w in windows) / len(windows) if windows else 0.0)
        bars.barh(ranks, values, left=left, color=colour, label=LABELS[part])
        left = [a + b for a, b in zip(left, values, strict=True)]
    bars.set_xlabel("ms per step")
    bars.set_ylabel("rank")
    bars.invert_yaxis()
    bars.set_title("Time breakdown per rank (mean over complete steps)")
    bars.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncols=5, fontsize="small")

    # One step on every rank, clocks corrected, on a common time axis.
    origin = None
    for result in analysis.ranks.values():
        t = result.timeline
        offset = analysis.offsets_ns.get(result.rank, 0)
        for s, _ in (t.compute, t.comm):
            if s.size:
                first = int(s.min()) - offset
                origin = first if origin is None else min(origin, first)
    origin = origin or 0
    for y, result in enumerate(analysis.ranks.values()):
        t = result.timeline
        offset = analysis.offsets_ns.get(result.rank, 0)
        for (s, e), colour, dy in ((t.compute, COLOURS["compute"], 0.2), (t.comm, COLOURS["exposed_comm"], -0.2)):
            if s.size:
                xs = [((a - offset - origin) / 1e6, (b - a) / 1e6) for a, b in zip(s.tolist(), e.tolist(), strict=True)]
                timeline.broken_barh(xs, (y + dy - 0.18, 0.36), facecolors=colour)
    timeline.set_yticks(range(len(analysis.ranks)), [str(r) for r in analysis.ranks])
    timeline.invert_yaxis()
    timeline.set_xlabel("ms (clock-corrected)")
    timeline.set_ylabel("rank")
    steps = {r.timeline.step for r in analysis.ranks.values()}
    which = f"step {steps.pop()}" if len(steps) == 1 and None not in steps else "first complete step"
    timeline.set_title(f"Timeline of the {which}: compute (lower) and communication (upper) kernels")
    fig.savefig(path, dpi=100)
    plt.close(fig)
