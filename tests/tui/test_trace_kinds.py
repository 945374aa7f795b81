"""The trace screen shows report.json's exposed time per kind and per purpose of collective (issue 25 part 2)."""

from __future__ import annotations

from deeptrace.report.model import load_report
from rich.console import Console
from xtop.screens.trace import render_report

from tests.tui.reports import report_json


def _kind(exposed_ms_per_step: float, pct: float) -> dict[str, object]:
    return {"count": 12, "bytes": 3 << 20, "total_ms": 40.0, "exposed_ms": 4 * exposed_ms_per_step,
            "exposed_ms_per_step": exposed_ms_per_step, "exposed_pct_of_step": pct}  # fmt: skip


def _text(report: dict[str, object]) -> str:
    console = Console(record=True, width=120)
    console.print(render_report(load_report(report)))
    return console.export_text()


def test_exposure_per_kind_and_purpose_mean_and_worst_rank() -> None:
    report = report_json()
    ranks = report["ranks"]
    assert isinstance(ranks, dict)
    for rank, (gather, dispatch) in {"0": (5.0, 1.0), "1": (7.0, 3.0)}.items():
        ranks[rank] |= {
            "collective_kinds": {"all_gather": _kind(gather, 2 * gather), "all_to_all": _kind(dispatch, 2 * dispatch)},
            "collective_purposes": {"fsdp_param_gather": _kind(gather, 2 * gather), "ep_dispatch": _kind(dispatch, 0)},
        }
    lines = {line.split()[0]: line.split() for line in _text(report).splitlines() if line.strip()}
    assert "exposed per kind of collective (mean per step)" in _text(report)
    assert lines["all_gather"] == ["all_gather", "6.00", "ms", "12.0%", "7.00", "ms", "(rank", "1)"]
    assert lines["all_to_all"] == ["all_to_all", "2.00", "ms", "4.0%", "3.00", "ms", "(rank", "1)"]
    assert lines["fsdp_param_gather"][1:4] == ["6.00", "ms", "12.0%"]
    assert lines["ep_dispatch"][1:4] == ["2.00", "ms", "0.0%"]


def test_no_kinds_no_table() -> None:
    assert "exposed per" not in _text(report_json())
