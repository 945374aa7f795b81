"""xtop's reading of a run directory, over real files written by deeptrace's writer and collector."""

import time
from pathlib import Path

import orjson
import pytest
from deeptrace.collect import Collector
from deeptrace.rundir import RankStepRecord, RunWriter, StepRecord, layout
from xtop.logs import LogTail
from xtop.run_source import RunSource
from xtop.series import DecimatedSeries

from tests.tui.builders import append_step, write_run
from tests.tui.reports import report_json


def test_metrics_are_followed_as_they_grow_and_the_eta_comes_from_the_step_rate(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    writer = write_run(run_dir, steps=3, max_steps=10)
    source = RunSource(run_dir)
    snap = source.poll()
    assert (snap.steps_seen, snap.step, snap.max_steps) == (3, 3, 10)
    assert snap.loss.points()[1] == [6.0, 3.0, 2.0]
    append_step(writer, 4, max_steps=10)
    writer.close()
    snap = source.poll()
    assert (snap.steps_seen, snap.step) == (4, 4)
    assert snap.last is not None and snap.last.loss == 1.5
    assert snap.eta_s is not None and snap.eta_s >= 0
    assert [r.rank for r in snap.ranks] == [0, 1]
    assert snap.ranks[0].mem_peak_bytes == 3 << 30


def test_a_copy_of_the_snapshot_stays_as_it_was_through_later_polls(tmp_path: Path) -> None:
    """What the worker hands the screens: the source's own snapshot changes at every poll, a copy never does."""
    run_dir = tmp_path / "run"
    writer = write_run(run_dir, steps=3, max_steps=10)
    source = RunSource(run_dir)
    shown = source.poll().copy()
    append_step(writer, 4, max_steps=10)
    writer.close()
    with layout.metrics_path(run_dir).open("ab") as handle:
        handle.write(b"not json\n")
    source.poll()
    snap = source.poll()  # the corrupt line is named by the poll after the one that read the step before it
    assert (snap.step, len(snap.loss.points()[1]), len(snap.problems)) == (4, 4, 1)
    assert (shown.step, shown.loss.points()[1], shown.problems) == (3, [6.0, 3.0, 2.0], [])
    assert shown.tokens_per_s.count == shown.grad_norm.count == 3 and shown.step == 3


def test_a_half_written_line_waits_and_a_corrupt_one_is_named(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    metrics = layout.metrics_path(run_dir)
    metrics.write_bytes(b'{"step": 1, "loss": 3.0}\n{"step": 2, "lo')
    source = RunSource(run_dir)
    snap = source.poll()
    assert (snap.steps_seen, snap.problems) == (1, [])
    with metrics.open("ab") as handle:
        handle.write(b'ss": 2.5}\nnot json\n')
    last = source.poll().last
    assert last is not None and (last.step, last.loss) == (2, 2.5)
    problems = source.poll().problems
    assert len(problems) == 1 and f"{metrics}:3" in problems[0]


def test_a_run_directory_without_metrics_or_not_yet_there_is_a_note(tmp_path: Path) -> None:
    assert "no such directory yet" in RunSource(tmp_path / "absent").poll().notes[0]
    (tmp_path / "empty").mkdir()
    snap = RunSource(tmp_path / "empty").poll()
    assert snap.problems == [] and snap.notes == [f"{layout.metrics_path(tmp_path / 'empty')}: no metrics yet"]


def test_a_running_rank_without_progress_is_stale(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    collectors = [
        Collector(run_dir, rank=r, world_size=2, heartbeat_interval_s=None, stack_signal=None) for r in (0, 1)
    ]
    for collector in collectors:
        collector.step_begin(7)
    collectors[0].flush(wait=True)
    collectors[1].flush(wait=True)
    now = time.time()
    ranks = RunSource(run_dir, stale_after_s=30).poll(now_wall_s=now + 5).ranks
    assert [(r.rank, r.state, r.stale) for r in ranks] == [(0, "running", False), (1, "running", False)]
    ranks = RunSource(run_dir, stale_after_s=30).poll(now_wall_s=now + 60).ranks
    assert [r.stale for r in ranks] == [True, True]
    for collector in collectors:
        collector.close()
    ranks = RunSource(run_dir, stale_after_s=30).poll(now_wall_s=time.time() + 60).ranks
    assert [(r.state, r.stale) for r in ranks] == [("closed", False), ("closed", False)]


def test_the_report_is_read_through_deeptraces_model_and_a_newer_schema_is_named(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / layout.REPORT_DIR).mkdir(parents=True)
    path = run_dir / layout.REPORT_DIR / "report.json"
    path.write_bytes(orjson.dumps(report_json()))
    source = RunSource(run_dir)
    snap = source.poll()
    assert snap.report is not None and snap.report_problem is None
    assert snap.report.stragglers.culprits[0].rank == 1
    path.write_bytes(orjson.dumps(report_json(schema_version=2)))
    snap = source.poll()
    assert snap.report is None
    assert (
        snap.report_problem
        == f"{path}: report schema version 2 is newer than this deeptrace reads (1): upgrade deeptrace"
    )


def test_a_long_series_stays_bounded_and_keeps_its_shape() -> None:
    series = DecimatedSeries(capacity=64)
    for step in range(100_000):
        series.append(step, float(step))
    xs, ys = series.points()
    assert len(xs) < 2 * 64 + series.stride
    assert xs == ys  # merged points stay on the line y = x
    assert ys[0] < 1000 and ys[-1] > 99_000
    series.append(100_000, float("nan"))
    assert series.last == 99_999.0  # a non-finite value (a skipped step) is a gap, not a point


def test_log_tail_reads_only_new_complete_lines(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    tail = LogTail(log)
    assert tail.poll() == []
    log.write_text("one\ntw")
    assert tail.poll() == ["one"]
    with log.open("a") as handle:
        handle.write("o\nthree\n")
    assert tail.poll() == ["two", "three"]
    log.write_text("new\n")  # replaced by a shorter file: followed again from its start
    assert tail.poll() == ["new"]


def test_writer_and_reader_agree_on_memory_fields(tmp_path: Path) -> None:
    with RunWriter(tmp_path / "run", rank=1, world_size=2) as writer:
        writer.append_rank_step(
            RankStepRecord(step=5, rank=1, step_time_s=0.25, mem_allocated_bytes=123, mem_peak_bytes=456)
        )
    ranks = RunSource(tmp_path / "run").poll().ranks
    assert [(r.rank, r.step, r.mem_allocated_bytes, r.mem_peak_bytes, r.step_time_s) for r in ranks] == [
        (1, 5, 123, 456, 0.25)
    ]


def _steps(writer: RunWriter, steps: range, scale: float = 1.0, **fields: object) -> None:
    for step in steps:
        values: dict[str, object] = {"step": step, "loss": scale * 6.0 / step, "time_unix_s": 1e9 + step}
        if step % 10 == 0:
            values["eval_loss"] = scale * 7.0 / step
        writer.append_step(StepRecord.model_validate(values | fields))


def test_the_eval_loss_is_a_series_of_its_own_steps_and_the_last_one_is_kept(tmp_path: Path) -> None:
    with RunWriter(tmp_path / "run", rank=0, world_size=1) as writer:
        _steps(writer, range(1, 26))
    snap = RunSource(tmp_path / "run").poll()
    assert snap.eval_loss.points() == ([10.0, 20.0], [0.7, 0.35])
    assert snap.last_eval == (20, 0.35)
    assert snap.loss.count == 25 and snap.step == 25
    assert RunSource(tmp_path / "run").poll().copy().last_eval == (20, 0.35)


def test_a_resume_forgets_the_steps_the_interrupted_attempt_logged_after_its_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with RunWriter(run_dir, rank=0, world_size=1) as writer:
        for step in range(1, 36):  # died after step 35: evaluated at 10, 20, 30; 12 and 33 skipped their update
            _steps(writer, range(step, step + 1), **({"loss": None, "skipped": True} if step in {12, 33} else {}))
    source = RunSource(run_dir)
    snap = source.poll()
    assert (snap.last_eval, snap.skipped) == ((30, 7.0 / 30), [12, 33])
    with RunWriter(run_dir, rank=0, world_size=1) as writer:
        writer.append_step(StepRecord(step=21, loss=9.0, resumed_from_step=20, time_unix_s=1e9 + 21))
        _steps(writer, range(22, 26), scale=2.0, max_steps=100)
    snap = source.poll()
    xs, ys = snap.loss.points()
    assert xs == [float(step) for step in range(1, 26) if step != 12]  # each once: 21-35 of the first attempt gone
    assert ys[19:] == [9.0, *(2.0 * 6.0 / step for step in range(22, 26))]
    assert snap.eval_loss.points() == ([10.0, 20.0], [0.7, 0.35])
    assert snap.last_eval == (20, 0.35)  # step 30's evaluation belonged to the forgotten steps
    assert (snap.resumes, snap.skipped) == ([(21, 20)], [12])
    assert snap.eta_s == pytest.approx((100 - 25) * 1.0)  # the step rate of the new attempt only


def test_a_step_logged_twice_is_one_step_with_the_later_fields() -> None:
    source = RunSource("/nowhere")
    snap = source.snapshot
    source._take_metrics(snap, StepRecord(step=10, loss=2.0, grad_norm=0.5))
    source._take_metrics(snap, StepRecord.model_validate({"step": 10, "eval_loss": 2.5}))
    assert snap.last is not None and (snap.last.loss, snap.last.grad_norm, snap.last.eval_loss) == (2.0, 0.5, 2.5)
    assert snap.loss.count == 1 and snap.last_eval == (10, 2.5)


def test_a_series_forgets_the_points_after_a_step_also_once_merged() -> None:
    series = DecimatedSeries(capacity=4)
    for step in range(1, 21):
        series.append(step, float(step))
    assert series.stride > 1
    series.drop_after(12)
    xs, ys = series.points()
    assert xs and max(xs) <= 12.5 and xs == ys and series.last == ys[-1]
    for step in range(13, 16):
        series.append(step, 100.0)
    assert series.points()[1][-1] == 100.0 and series.last == 100.0
    series.drop_after(0)
    assert (series.points(), series.last, series.count) == (([], []), None, 0)
