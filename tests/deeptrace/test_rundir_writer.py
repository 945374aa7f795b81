"""RunWriter and the readers: every file round-trips, ranks are discovered, misuse and bad files are explained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deeptrace.errors import TraceInputError
from deeptrace.rundir import (
    FORMAT_VERSION,
    RunDirectoryError,
    RunWriter,
    discover_ranks,
    layout,
    read_config_toml,
    read_meta,
    read_metrics,
    read_rank_records,
)
from deeptrace.rundir.step_records import RankStepRecord, StepRecord


def test_meta_round_trips_with_every_field(tmp_path: Path) -> None:
    with RunWriter(tmp_path, 0, 4) as writer:
        written = writer.write_meta(
            run_id="r1",
            start_time_unix_s=1_700_000_000.5,
            rank_hosts={0: "a", 1: "a", 2: "b", 3: "b"},
            versions={"torch": "2.13.0"},
            model_flops_per_token=1.5e9,
            device_peak_flops=989e12,
            extras={"note": "x"},
        )
    meta = read_meta(tmp_path)
    assert meta == written
    assert meta.hosts == ["a", "b"]
    assert meta.rank_hosts == {0: "a", 1: "a", 2: "b", 3: "b"}
    assert meta.versions["torch"] == "2.13.0" and "python" in meta.versions and "deeptrace" in meta.versions
    raw = json.loads(layout.meta_path(tmp_path).read_text())
    assert raw["format_version"] == FORMAT_VERSION
    assert raw["start_time"] == "2023-11-14T22:13:20Z"
    assert raw["rank_hosts"] == {"0": "a", "1": "a", "2": "b", "3": "b"}


def test_meta_defaults_fill_every_rank_with_this_host(tmp_path: Path) -> None:
    RunWriter(tmp_path, 0, 3).write_meta()
    meta = read_meta(tmp_path)
    assert sorted(meta.rank_hosts) == [0, 1, 2] and len(set(meta.rank_hosts.values())) == 1
    assert meta.world_size == 3 and meta.run_id


def test_only_rank_zero_writes_run_wide_files(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path, 1, 2)
    for call in (
        writer.write_meta,
        lambda: writer.write_config_toml("x=1"),
        lambda: writer.append_step(StepRecord(step=0)),
    ):
        with pytest.raises(RunDirectoryError, match="rank 0 only"):
            call()


def test_rank_outside_world_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RunDirectoryError, match="0 <= rank < world_size"):
        RunWriter(tmp_path, 4, 4)


def test_metrics_are_flushed_per_step_and_read_back_in_order(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path, 0, 1)
    writer.append_step(StepRecord(step=0, loss=2.5, lr=1e-3))
    # Flushed before returning: another reader sees it while the writer is still open.
    assert read_metrics(tmp_path)[0].loss == 2.5
    writer.append_step(StepRecord(step=1, loss=2.25, lr=1e-3, tokens=1024))
    records = read_metrics(tmp_path)
    assert [r.step for r in records] == [0, 1]
    assert records[1].tokens == 1024 and records[1].time_unix_s >= records[0].time_unix_s
    writer.close()


def test_metrics_missing_file_is_empty(tmp_path: Path) -> None:
    assert read_metrics(tmp_path) == []


def test_config_toml_round_trips(tmp_path: Path) -> None:
    RunWriter(tmp_path, 0, 1).write_config_toml('[model]\nname = "debug"\n')
    assert read_config_toml(tmp_path) == '[model]\nname = "debug"\n'


def test_rank_records_per_rank_and_discovery(tmp_path: Path) -> None:
    for rank in (0, 2):
        with RunWriter(tmp_path, rank, 3) as writer:
            writer.append_rank_step(
                RankStepRecord(
                    step=0, rank=rank, step_time_s=0.5, data_wait_s=0.01, mem_allocated_bytes=10, mem_peak_bytes=20
                )
            )
            writer.append_rank_step(RankStepRecord(step=1, rank=rank, step_time_s=0.4, tokens=128))
    records = read_rank_records(tmp_path)
    assert sorted(records) == [0, 2]
    assert records[2][0].mem_peak_bytes == 20 and records[2][0].rank == 2
    assert records[0][1].tokens == 128 and records[0][1].mem_peak_bytes is None
    assert discover_ranks(tmp_path) == [0, 2]


def test_discover_ranks_from_every_kind_of_per_rank_file(tmp_path: Path) -> None:
    layout.heartbeat_dir(tmp_path).mkdir(parents=True)
    layout.heartbeat_path(tmp_path, 5).write_text("{}")
    layout.logs_dir(tmp_path).mkdir()
    layout.log_path(tmp_path, 1).write_text("")
    layout.trace_dir(tmp_path).mkdir()
    layout.trace_path(tmp_path, 3).write_bytes(b"")
    (layout.trace_dir(tmp_path) / "rank-7.attempt-1.dtr").write_bytes(b"")  # an earlier attempt: not a rank file
    (layout.trace_dir(tmp_path) / "notes.txt").write_text("")
    assert discover_ranks(tmp_path) == [1, 3, 5]


def test_completed_checkpoints_need_their_marker(tmp_path: Path) -> None:
    for step in (10, 2, 30):
        layout.checkpoint_dir(tmp_path, step).mkdir(parents=True)
    layout.checkpoint_complete_marker(tmp_path, 10).touch()
    layout.checkpoint_complete_marker(tmp_path, 2).touch()
    assert layout.completed_checkpoint_steps(tmp_path) == [2, 10]


def test_meta_from_a_newer_format_is_refused_with_the_fix(tmp_path: Path) -> None:
    RunWriter(tmp_path, 0, 1).write_meta()
    raw = json.loads(layout.meta_path(tmp_path).read_text())
    raw["format_version"] = FORMAT_VERSION + 1
    layout.meta_path(tmp_path).write_text(json.dumps(raw))
    with pytest.raises(TraceInputError, match="upgrade deeptrace") as caught:
        read_meta(tmp_path)
    assert caught.value.path == layout.meta_path(tmp_path)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("", "empty"),
        ('{"format_version": 1, "run_id": ', "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"format_version": 1, "run_id": "x"}', "field"),
        (
            '{"format_version": 1, "run_id": 5, "start_time_unix_s": 1, "world_size": 1, "hosts": [], '
            '"rank_hosts": {}, "versions": {}}',
            "'run_id' is int, expected str",
        ),
    ],
)
def test_bad_meta_names_the_file_and_the_problem(tmp_path: Path, content: str, problem: str) -> None:
    layout.meta_path(tmp_path).write_text(content)
    with pytest.raises(TraceInputError, match=problem) as caught:
        read_meta(tmp_path)
    assert str(layout.meta_path(tmp_path)) in str(caught.value)


def test_missing_meta_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceInputError, match="file not found"):
        read_meta(tmp_path)


def test_numpy_values_are_written_as_json_numbers(tmp_path: Path) -> None:
    import numpy as np

    with RunWriter(tmp_path, 0, 1) as writer:
        # A loop's own figures (extras) may be numpy values; the declared fields are typed.
        writer.append_step(StepRecord(step=0, loss=1.5, grad_norm=float("nan"), my_tokens=np.int64(7)))
        writer.append_rank_step(RankStepRecord(step=0, rank=0, step_time_s=np.float64(0.25), my_peak=np.float32(2)))
    metrics = read_metrics(tmp_path)[0]
    assert metrics.loss == 1.5 and metrics.extras == {"my_tokens": 7}
    assert metrics.grad_norm is None  # JSON has no NaN
    assert read_rank_records(tmp_path)[0][0].extras == {"my_peak": 2.0}


def test_step_records_carry_their_version_and_a_newer_one_is_refused_by_name(tmp_path: Path) -> None:
    with RunWriter(tmp_path, 0, 1) as writer:
        writer.append_step(StepRecord(step=0, loss=1.0))
    line = json.loads(layout.metrics_path(tmp_path).read_text())
    assert line["format_version"] == 1 and "mfu" not in line  # a figure without a value is left out
    with layout.metrics_path(tmp_path).open("a") as handle:
        handle.write(json.dumps({"format_version": 2, "step": 1}) + "\n")
    with pytest.raises(TraceInputError, match=r"metrics.jsonl:2: format_version 2 is newer than this deeptrace"):
        read_metrics(tmp_path)


def test_a_line_without_a_version_is_read_as_version_one(tmp_path: Path) -> None:
    """Run directories written before records carried a version."""
    layout.metrics_path(tmp_path).write_text('{"step": 3, "time_unix_s": 5.0, "loss": 2.0, "mfu": 0.5}\n')
    (record,) = read_metrics(tmp_path)
    assert (record.step, record.loss, record.mfu, record.format_version) == (3, 2.0, 0.5, 1)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"loss": 1.0}', "missing field 'step'"),
        ('{"step": "3"}', "field 'step'"),
        ('{"step": true}', "field 'step'"),
        ('{"step": 1, "loss": "low"}', "field 'loss'"),
        ('{"step": 1, "skipped": 1}', "field 'skipped'"),
    ],
)
def test_a_record_of_the_wrong_shape_is_named_by_file_line_and_field(tmp_path: Path, line: str, problem: str) -> None:
    layout.metrics_path(tmp_path).write_text('{"step": 0}\n' + line + "\n")
    with pytest.raises(TraceInputError, match=problem) as raised:
        read_metrics(tmp_path)
    assert raised.value.line == 2 and raised.value.path == layout.metrics_path(tmp_path)


def test_a_rank_record_goes_only_to_its_own_rank_file(tmp_path: Path) -> None:
    with (
        RunWriter(tmp_path, 1, 2) as writer,
        pytest.raises(RunDirectoryError, match="rank 0 given to the writer of rank 1"),
    ):
        writer.append_rank_step(RankStepRecord(step=0, rank=0))
