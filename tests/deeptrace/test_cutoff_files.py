"""Files cut off mid-record, as a node that died leaves them: read up to the last whole record, the cut named.

Real run directories (the fixtures' RunWriter and Collector) are cut at several byte offsets, then read by
`deeptrace analyze` (its command line), by `deeptrace watch`'s reader and by xtop's run source. Each cut file
must give the records before the cut (the same as a file that ends at the last whole record) and one note naming
the file, never a traceback.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from deeptrace.analysis.record_files import RECORD_START
from deeptrace.cli import main
from deeptrace.collect import trace_format as fmt
from deeptrace.errors import CutOffError
from deeptrace.rundir import StepRecord, follow_metrics, layout, read_metrics
from deeptrace.rundir.jsonl import read_records, scan_records
from deeptrace.watch.follow import TraceFollower
from deeptrace.watch.session import Watch, WatchConfig
from xtop.run_source import RunSource

from tests.deeptrace.fixtures_runs import build_clean_run
from tests.deeptrace.kineto_builders import allreduce_ranks

WORLD = 2
STEPS = 4


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    build_clean_run(tmp_path / "run", world_size=WORLD, steps=STEPS)
    return tmp_path / "run"


def _analyze(folder: Path) -> tuple[dict[str, Any], str]:
    result = CliRunner().invoke(
        main, ["analyze", str(folder), "--json", "--no-png", "-j", "1", "-o", str(folder.parent / "out")]
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output, result.output
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.stdout)
    return report, result.stderr


def _cut(path: Path, offset: int) -> bytes:
    """Cut `path` to its first `offset` bytes, and make it look untouched for a minute (its writer is dead)."""
    data = path.read_bytes()
    path.write_bytes(data[:offset])
    old = time.time() - 60
    os.utime(path, (old, old))
    return data


def _line_offsets(data: bytes) -> list[int]:
    """Cut points inside each line of a JSON Lines file: just after its start, in its middle, one byte short of
    its closing brace (the cuts that leave an unfinished record)."""
    offsets, start = [], 0
    for line in data.split(b"\n")[:-1]:
        offsets += [start + 1, start + len(line) // 2, start + len(line) - 1]
        start += len(line) + 1
    return offsets


def _input(report: dict[str, Any], path: Path) -> dict[str, Any]:
    [entry] = [i for i in report["inputs"] if i["path"] == str(path)]
    return entry


# --- record files: metrics.jsonl and ranks/rank-R.jsonl --------------------------------------------------------


@pytest.mark.parametrize("which", ["metrics", "rank_records"])
@pytest.mark.parametrize("line", [0, 1, STEPS - 1])
@pytest.mark.parametrize("where", [0, 1, 2])  # the three cut points of `_line_offsets` in that line
def test_analyze_reads_a_cut_record_file_up_to_its_last_whole_record(
    run_dir: Path, which: str, line: int, where: int
) -> None:
    path = layout.metrics_path(run_dir) if which == "metrics" else layout.rank_records_path(run_dir, 1)
    data = path.read_bytes()
    offset = _line_offsets(data)[3 * line + where]
    _cut(path, offset)
    report, stderr = _analyze(run_dir)
    entry = _input(report, path)
    assert entry["kind"] == which and entry["error"] is None
    assert entry["records"] == line  # the whole lines before the cut
    assert entry["last_step"] == (line - 1 if line else None)
    assert entry["cut"] is not None and f"{path}:{line + 1}: cut off" in entry["cut"]
    notes = [w for w in report["warnings"] if str(path) in w]
    assert notes == [entry["cut"]]
    assert sum(str(path) in said for said in stderr.splitlines()) == 1
    assert sorted(report["ranks"]) == ["0", "1"]  # the traces are analysed as before


def test_analyzes_quick_scan_agrees_with_the_full_reader_at_every_cut(run_dir: Path) -> None:
    """analyze counts a record file's lines and parses its end only (`scan_records`); at every byte where the
    file may be cut, and with a later attempt's record glued after a cut, it says what `read_records` says."""
    path = layout.metrics_path(run_dir)
    data = path.read_bytes()
    lines = data.split(b"\n")
    glued = b"\n".join([lines[0], lines[1][:30] + StepRecord(step=1, loss=1.5).to_line()]) + lines[2] + b"\n"
    for content in [*(data[:offset] for offset in range(len(data) + 1)), glued, b"\n\n" + data + b"\n"]:
        path.write_bytes(content)
        cuts: list[CutOffError] = []
        records = read_records(path, StepRecord.from_line, cuts=cuts)
        scan = scan_records(path, StepRecord.from_line, RECORD_START)
        assert (scan.records, scan.last, [str(c) for c in scan.cuts]) == (
            len(records),
            records[-1] if records else None,
            [str(c) for c in cuts],
        ), content


def test_a_whole_record_file_has_no_cut_note(run_dir: Path) -> None:
    report, _ = _analyze(run_dir)
    metrics = _input(report, layout.metrics_path(run_dir))
    assert (metrics["records"], metrics["last_step"], metrics["cut"]) == (STEPS, STEPS - 1, None)
    assert not [w for w in report["warnings"] if "cut off" in w]


def test_a_cut_file_that_a_later_attempt_appended_to_keeps_both_sides_of_the_cut(run_dir: Path) -> None:
    """A retried job appends to metrics.jsonl after the dead attempt's unfinished line: the two share a line."""
    path = layout.metrics_path(run_dir)
    data = path.read_bytes()
    lines = data.split(b"\n")
    cut_line = lines[2][: len(lines[2]) // 2]
    resumed = StepRecord(step=2, loss=1.5, resumed_from_step=1).to_line()  # as the writer writes it
    path.write_bytes(b"\n".join([*lines[:2], cut_line + resumed.rstrip(b"\n"), lines[3]]) + b"\n")
    cuts: list[CutOffError] = []
    records = read_metrics(run_dir, cuts=cuts)
    assert [r.step for r in records] == [0, 1, 2, 3]
    assert (records[2].loss, records[2].resumed_from_step) == (1.5, 1)  # the whole record after the cut
    assert [(c.path, c.line) for c in cuts] == [(path, 3)]
    report, _ = _analyze(run_dir)
    entry = _input(report, path)
    assert (entry["records"], entry["last_step"]) == (4, 3)
    assert "appended a whole record after the cut" in entry["cut"]


def test_a_follower_names_a_cut_once_the_file_has_stopped_growing(run_dir: Path) -> None:
    path = layout.metrics_path(run_dir)
    data = path.read_bytes()
    offset = _line_offsets(data)[3 * 2 + 1]  # the middle of the third line
    path.write_bytes(data[:offset])  # just now: a live writer in the middle of its line, as far as one can tell
    follower = follow_metrics(run_dir)
    assert [r.step for r in follower.poll()] == [0, 1]
    assert follower.poll() == []  # no note yet: the writer may finish the line
    _cut(path, offset)  # the same bytes, untouched for a minute: the writer died
    with pytest.raises(CutOffError, match=rf"{path}:3: cut off"):
        follower.poll()
    with path.open("ab") as handle:  # the next attempt finishes nothing but appends a whole record after it
        handle.write(StepRecord(step=2, loss=1.5).to_line())
    assert [(r.step, r.loss) for r in follower.poll()] == [(2, 1.5)]
    with pytest.raises(CutOffError, match="appended a whole record after the cut"):
        follower.poll()  # said once, after the records
    assert follower.poll() == []


def test_xtop_reads_a_cut_run_up_to_the_cut_and_names_the_file(run_dir: Path) -> None:
    metrics = layout.metrics_path(run_dir)
    ranks_file = layout.rank_records_path(run_dir, 0)
    _cut(metrics, _line_offsets(metrics.read_bytes())[3 * 3 + 1])  # inside the fourth step's line
    _cut(ranks_file, _line_offsets(ranks_file.read_bytes())[3 * 1 + 2])  # inside the second step's line
    beat = layout.heartbeat_path(run_dir, 1)
    _cut(beat, beat.stat().st_size // 2)
    source = RunSource(run_dir)
    snap = source.poll()
    assert snap.steps_seen == 3 and snap.last is not None and snap.last.step == 2
    ranks = {r.rank: r for r in snap.ranks}
    assert ranks[0].step == STEPS - 1  # from its heartbeat
    assert any(str(beat) in p and "cut off" in p for p in snap.problems)
    snap = source.poll()  # the records were delivered; now the cuts are named
    assert any(f"{metrics}:4: cut off" in p for p in snap.problems), snap.problems
    assert any(f"{ranks_file}:2: cut off" in p for p in snap.problems), snap.problems
    assert snap.steps_seen == 3


# --- heartbeats -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.99])
def test_a_cut_heartbeat_is_named_by_analyze_and_watch(run_dir: Path, fraction: float) -> None:
    beat = layout.heartbeat_path(run_dir, 1)
    _cut(beat, int(beat.stat().st_size * fraction))
    report, _ = _analyze(run_dir)
    entry = _input(report, beat)
    assert entry["cut"] is not None and "cut off" in entry["cut"] and entry["error"] is not None
    assert sum(str(beat) in w for w in report["warnings"]) == 1
    assert _input(report, layout.heartbeat_path(run_dir, 0))["last_step"] == STEPS - 1

    status, _ = Watch(run_dir, WatchConfig()).step()
    views = {v.rank: v for v in status.ranks}
    assert views[0].state == "closed"
    assert views[1].state == "unreadable" and str(beat) in views[1].note and "cut off" in views[1].note
    assert status.message != "every rank closed its Collector"  # rank 1's end is not known


def test_watch_once_on_a_cut_heartbeat_names_it_without_a_traceback(run_dir: Path) -> None:
    beat = layout.heartbeat_path(run_dir, 1)
    _cut(beat, 100)
    result = CliRunner().invoke(main, ["watch", str(run_dir), "--once"])
    assert "Traceback" not in result.output and result.exit_code == 0, result.output
    assert "rank 1: unreadable" in result.stdout and str(beat) in result.stdout


# --- collector traces (trace/rank-R.dtr) ----------------------------------------------------------------------


def _record_ends(data: bytes) -> list[int]:
    """The byte offset after each record of a collector trace (header, strings, spans)."""
    position = fmt.HEADER.unpack_from(data, 0)[2]
    ends = [position]
    while position < len(data):
        if data[position] == fmt.TAG_STRING:
            position += fmt.STRING_HEAD.size + fmt.STRING_HEAD.unpack_from(data, position)[2]
        else:
            position += fmt.SPAN.size
        ends.append(position)
    return ends


def _rank_figures(report: dict[str, Any], rank: int) -> dict[str, Any]:
    entry = dict(report["ranks"][str(rank)])
    entry.pop("path")
    return entry


@pytest.mark.parametrize("kind", ["span", "last"])  # the record the cut falls in
@pytest.mark.parametrize("into", [1, 9, 57])  # bytes of it left
def test_analyze_reads_a_cut_trace_as_the_trace_up_to_its_last_whole_record(
    tmp_path: Path, kind: str, into: int
) -> None:
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    for folder in (whole, cut):
        build_clean_run(folder / "run", world_size=WORLD, steps=STEPS)
    trace = layout.trace_dir(cut / "run") / "rank-1.dtr"
    data = trace.read_bytes()
    ends = _record_ends(data)
    tags = [data[start] for start in ends[:-1]]  # tags[i]: the record that ends at ends[i + 1]
    record = (tags.index(fmt.TAG_SPAN) + 5 if kind == "span" else len(tags) - 1) + 1
    boundary, end = ends[record - 1], ends[record]
    offset = boundary + min(into, end - boundary - 1)
    # The expected answer: the other copy of the run (the same records, other times) ending at that boundary.
    whole_trace = layout.trace_dir(whole / "run") / "rank-1.dtr"
    assert _record_ends(whole_trace.read_bytes()) == ends
    _cut(whole_trace, boundary)
    _cut(trace, offset)
    expected, _ = _analyze(whole / "run")
    got, stderr = _analyze(cut / "run")
    assert _input(expected, whole_trace)["cut"] is None
    entry = _input(got, trace)
    assert entry["error"] is None and entry["cut"] is not None and f"{trace}: cut off" in entry["cut"]
    assert sum(str(trace) in w for w in got["warnings"]) == 1 and str(trace) in stderr
    mine, theirs = _rank_figures(got, 1), _rank_figures(expected, 1)
    assert mine["kernels"] == theirs["kernels"] and mine["collectives"]["count"] == theirs["collectives"]["count"]
    assert [s["step"] for s in mine["steps"]] == [s["step"] for s in theirs["steps"]]


def test_a_trace_cut_before_its_first_span_is_skipped_with_a_note_naming_the_cut(run_dir: Path) -> None:
    trace = layout.trace_dir(run_dir) / "rank-1.dtr"
    data = trace.read_bytes()
    ends = _record_ends(data)
    last_string = max(i for i, start in enumerate(ends[:-1]) if data[start] == fmt.TAG_STRING)
    _cut(trace, ends[last_string] + 3)  # inside the last string record, before any span
    report, stderr = _analyze(run_dir)
    entry = _input(report, trace)
    assert entry["error"] is not None and "nothing to analyse" in entry["error"] and "cut off" in entry["error"]
    assert sorted(report["ranks"]) == ["0"]
    assert sum(str(trace) in said for said in stderr.splitlines()) == 1


def test_watch_follows_a_cut_trace_to_its_last_whole_record_and_names_it_once(run_dir: Path) -> None:
    trace = layout.trace_dir(run_dir) / "rank-1.dtr"
    ends = _record_ends(trace.read_bytes())
    offset = ends[-4] + 10
    data = trace.read_bytes()
    trace.write_bytes(data[:offset])  # just now: as a live writer may leave it for a moment
    warnings: list[str] = []
    watch = Watch(run_dir, WatchConfig(), warn=warnings.append)
    watch.step()
    assert warnings == []
    _cut(trace, offset)  # untouched for a minute: the writer died there
    watch.step()
    watch.step()
    assert warnings == [
        f"{trace}: cut off inside its last record (10 bytes of a record its writer never finished: it died "
        "mid-record); followed up to the last whole record"
    ]
    # What it followed is what a file ending at the last whole record gives.
    trace.write_bytes(data[: ends[-4]])
    fresh = TraceFollower(run_dir).poll()[1]
    followed = watch.follower.ranks[1]
    assert list(followed.arrivals) == list(fresh.arrivals) and list(followed.steps) == list(fresh.steps)
    assert len(followed.arrivals) > 0


# --- Kineto traces (whole-file JSON) --------------------------------------------------------------------------


def _write_kineto(path: Path, doc: dict[str, Any], events: list[dict[str, Any]]) -> list[int]:
    """A Kineto trace as the profiler writes it: metadata, then traceEvents one per line, then the keys after
    them. Returns the byte offset where each event starts."""
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    text = json.dumps({**{k: head[k] for k in ("schemaVersion", "distributedInfo")}})[:-1] + ', "traceEvents": [\n'
    starts = []
    for number, event in enumerate(events):
        starts.append(len(text.encode()))
        text += json.dumps(event) + (",\n" if number < len(events) - 1 else "\n")
    text += '], "displayTimeUnit": "ms", "baseTimeNanoseconds": 0}'
    path.write_text(text)
    return starts


@pytest.mark.parametrize("event", [3, 10, -2])
def test_analyze_reads_a_cut_kineto_trace_up_to_its_last_whole_event(tmp_path: Path, event: int) -> None:
    traces = allreduce_ranks(2, steps=3, per_step=2)
    whole, cut = tmp_path / "whole" / "traces", tmp_path / "cut" / "traces"
    for folder in (whole, cut):
        folder.mkdir(parents=True)
        _write_kineto(folder / "rank-0.json", traces[0].document(), traces[0].events)
    events = traces[1].events
    index = event % len(events)
    starts = _write_kineto(cut / "rank-1.json", traces[1].document(), events)
    path = cut / "rank-1.json"
    _cut(path, starts[index] + 15)
    _write_kineto(whole / "rank-1.json", traces[1].document(), events[:index])  # what was before the cut
    expected, _ = _analyze(whole)
    got, stderr = _analyze(cut)
    entry = _input(got, path)
    assert entry["error"] is None and entry["cut"] is not None
    assert f"{path}: cut off inside traceEvents" in entry["cut"] and f"read the {index} whole events" in entry["cut"]
    assert sum(str(path) in said and "cut off" in said for said in stderr.splitlines()) == 1
    mine, theirs = _rank_figures(got, 1), _rank_figures(expected, 1)
    assert mine["kernels"] == theirs["kernels"] and mine["steps"] == theirs["steps"]
    assert mine["breakdown"] == theirs["breakdown"]


def test_a_kineto_trace_cut_before_its_events_is_skipped_with_a_note(tmp_path: Path) -> None:
    traces = allreduce_ranks(2, steps=2, per_step=2)
    for trace in traces:
        _write_kineto(tmp_path / f"rank-{trace.rank}.json", trace.document(), trace.events)
    path = tmp_path / "rank-1.json"
    _cut(path, 30)  # inside the metadata: nothing of the trace is known
    report, stderr = _analyze(tmp_path)
    entry = _input(report, path)
    assert entry["error"] is not None and "truncated" in entry["error"]
    assert sorted(report["ranks"]) == ["0"]
    assert sum(str(path) in said for said in stderr.splitlines()) == 1
