"""Where the report files go, and writing them all: report.json, report.md, summary.png, merged_trace.json."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import orjson

from deeptrace.analysis.run import RunAnalysis
from deeptrace.report.model import Report
from deeptrace.rundir import layout

REPORT_JSON = layout.REPORT_FILE
REPORT_MD = "report.md"
SUMMARY_PNG = "summary.png"
MERGED_TRACE = "merged_trace.json"


class OutputDirError(ValueError):
    """The output folder cannot be written."""


def output_dir(run_dir: Path, output: Path | None) -> Path:
    """The folder for the report files (RUN_DIR/deeptrace unless --output), checked writable but not yet created."""
    target = output if output is not None else layout.report_dir(run_dir)
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise OutputDirError(f"{existing}: not a directory, so the report cannot go to {target}; pass --output DIR")
    if _marked_read_only(existing):
        # Root may write anywhere; a folder marked read-only (like shared reference data) is still respected.
        raise OutputDirError(
            f"{existing} is read-only (mode {stat.filemode(existing.stat().st_mode)}): the report cannot go to"
            f" {target}; " + ("choose another folder with --output DIR" if output is not None else "pass --output DIR")
        )
    return target


def _marked_read_only(folder: Path) -> bool:
    return folder.stat().st_mode & 0o222 == 0 or not os.access(folder, os.W_OK)


def report_json_bytes(report: Report) -> bytes:
    return orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n"


def write_outputs(
    report: Report, analysis: RunAnalysis, folder: Path, *, merge: bool, png: bool = True
) -> dict[str, Path]:
    from deeptrace.report.markdown import render_markdown  # noqa: PLC0415  # lazy: keeps --help and light commands fast

    folder.mkdir(parents=True, exist_ok=True)
    written = {"json": folder / REPORT_JSON, "md": folder / REPORT_MD}
    if png and analysis.ranks:
        from deeptrace.report.png import write_png  # noqa: PLC0415  # lazy: keeps --help and light commands fast

        written["png"] = folder / SUMMARY_PNG
        write_png(report, analysis, written["png"])
    written["json"].write_bytes(report_json_bytes(report))
    written["md"].write_text(render_markdown(report, SUMMARY_PNG if "png" in written else None), encoding="utf-8")
    if merge:
        from deeptrace.report.merge import write_merged_trace  # noqa: PLC0415  # lazy: keeps --help and light commands fast

        written["merged"] = folder / MERGED_TRACE
        write_merged_trace(analysis.ranks, analysis.offsets_ns, written["merged"])
    return written
