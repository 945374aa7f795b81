"""Experiment trackers ([track]): TensorBoard, MLflow (a folder and a sqlite:/// store) and W&B offline get the
step scalars of metrics.jsonl, read back through each library's own reader; a resumed run continues the same
tracked run with no step twice; a missing extra is one message before any process starts; a tracker that fails
never stops training."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from xtrain.train.tracking import Trackers

from tests.engine.checkpoint.cli_runs import DEBUG_CONFIG, environment, short_run, xtrain
from tests.engine.train.test_cli_errors import assert_user_error

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.xdist_group("tracked-run")]

SCALARS = ("loss", "aux_loss", "z_loss", "grad_norm", "lr", "tokens_per_s", "mfu", "eval_loss")


def _settings(root: Path, *extra: str) -> list[str]:
    tracked = ("track.tensorboard=true", f'track.mlflow="sqlite:///{root}/mlflow.db"', 'track.wandb="offline"')
    return short_run(root / "cache", *tracked, *extra)


def _metrics(run_dir: Path) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        found[record["step"]] = record
    return found


def _expected(run_dir: Path, name: str) -> dict[int, float]:
    return {step: record[name] for step, record in _metrics(run_dir).items() if record.get(name) is not None}


def _tensorboard(run_dir: Path, name: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    points = [(event.step, event.value) for event in events.Scalars(name)]
    assert len(points) == len({step for step, _ in points}), f"a step twice in {name}"
    return dict(points)


def _mlflow(uri: str, run_dir: Path, name: str) -> dict[int, float]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(DEBUG_CONFIG.stem)
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == run_dir.name and run.data.params["train.max_steps"] == "6"
    history = client.get_metric_history(run.info.run_id, name)
    assert len(history) == len({metric.step for metric in history}), f"a step twice in {name}"
    return {metric.step: metric.value for metric in history}


def _wandb(run_dir: Path, name: str) -> dict[int, float]:
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    found: dict[int, float] = {}
    for log_file in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        store = datastore.DataStore()
        store.open_for_scan(str(log_file))
        while (data := store.scan_data()) is not None:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            if record.WhichOneof("record_type") != "history":
                continue
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            if name in items:
                step = int(items["_step"])
                assert step not in found, f"step {step} twice in W&B's {name}"
                found[step] = float(items[name])
    return found


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tracked")
    run_dir = root / "run"
    result = xtrain("train", DEBUG_CONFIG, "--nproc", "2", "--run-dir", run_dir, *_settings(root), cwd=root)
    assert result.returncode == 0, result.stderr
    assert "tracker" not in result.stderr, result.stderr  # no tracker failed
    return run_dir


@pytest.mark.parametrize("name", SCALARS)
def test_every_tracker_holds_the_scalars_of_metrics_jsonl(tracked_run: Path, name: str) -> None:
    expected = _expected(tracked_run, name)
    assert sorted(expected) == list(range(1, 7)) or name == "eval_loss"
    uri = f"sqlite:///{tracked_run.parent}/mlflow.db"
    for reader, read in (
        ("tensorboard", lambda: _tensorboard(tracked_run, name)),
        ("mlflow", lambda: _mlflow(uri, tracked_run, name)),
        ("wandb", lambda: _wandb(tracked_run, name)),
    ):
        got = read()
        assert sorted(got) == sorted(expected), (reader, name)
        for step, value in expected.items():
            assert got[step] == pytest.approx(value, rel=1e-6), (reader, name, step)


def test_memory_is_tracked_from_rank_0(tracked_run: Path) -> None:
    ranks = [json.loads(line) for line in (tracked_run / "ranks" / "rank-0.jsonl").read_text().splitlines()]
    peaks = {record["step"]: record["mem_peak_bytes"] for record in ranks}
    assert _tensorboard(tracked_run, "memory/peak_bytes") == pytest.approx(peaks)


def test_a_resumed_run_continues_the_same_tracked_runs_with_no_step_twice(tracked_run: Path, tmp_path: Path) -> None:
    """A crash after step 5 (checkpoints 4 and 6 lost, the trackers hold steps 1-6 of the first attempt): the
    resume from step 2 runs steps 3-6 again; every tracker still has each step once, with the same values."""
    root = tmp_path
    crashed = root / "run"
    shutil.copytree(tracked_run, crashed)
    shutil.copy(tracked_run.parent / "mlflow.db", root / "mlflow.db")
    for step in (4, 6):
        shutil.rmtree(crashed / "checkpoints" / f"step-{step}")
    result = xtrain("train", DEBUG_CONFIG, "--nproc", "2", "--run-dir", crashed, *_settings(root), cwd=root)
    assert result.returncode == 0, result.stderr
    assert _metrics(crashed)[3]["resumed_from_step"] == 2
    expected = _expected(tracked_run, "loss")
    assert _tensorboard(crashed, "loss") == pytest.approx(expected, rel=1e-6)
    assert _mlflow(f"sqlite:///{root}/mlflow.db", crashed, "loss") == pytest.approx(expected, rel=1e-6)
    assert _wandb(crashed, "loss") == pytest.approx(expected, rel=1e-6)


def test_a_missing_extra_is_one_message_before_anything_starts(tmp_path: Path) -> None:
    """mlflow hidden from the interpreter, as on a machine without xtrain[mlflow]."""
    # A None entry in sys.modules is how Python marks a module as absent: find_spec and import both see none.
    hide = "import sys; sys.modules['mlflow'] = None\nfrom xtrain.cli import main\nsys.exit(main())\n"
    run_dir = tmp_path / "run"
    args = ["train", str(DEBUG_CONFIG), "--nproc", "2", "--run-dir", str(run_dir), "--set", 'track.mlflow="x"']
    result = subprocess.run(
        [sys.executable, "-c", hide, *args], capture_output=True, text=True, env=environment(), cwd=tmp_path,
        check=False, timeout=300,
    )  # fmt: skip
    assert_user_error(result, "track.mlflow needs the mlflow package", "pip install 'xtrain[mlflow]'")
    assert not run_dir.exists()


def test_a_store_that_cannot_be_written_is_one_warning_and_training_goes_on(tmp_path: Path) -> None:
    """The MLflow store's folder is under a file: the tracker cannot write it; one warning, the run finishes,
    and the other tracker keeps every step."""
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    run_dir = tmp_path / "run"
    settings = short_run(tmp_path / "cache", "track.tensorboard=true", f'track.mlflow="{blocked}/store"')
    result = xtrain("train", DEBUG_CONFIG, "--nproc", "2", "--run-dir", run_dir, *settings, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("tracker mlflow could not start") == 1
    assert sorted(_metrics(run_dir)) == list(range(1, 7))
    assert sorted(_tensorboard(run_dir, "loss")) == list(range(1, 7))


class _Failing:
    name = "failing"

    def __init__(self) -> None:
        self.calls = 0

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.calls += 1
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        raise AssertionError("a tracker that failed is not closed again")


class _Recording:
    name = "recording"

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.closed = False

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.steps.append(step)

    def close(self) -> None:
        self.closed = True


def test_a_failing_tracker_is_warned_about_once_and_left_out(caplog: pytest.LogCaptureFixture) -> None:
    failing, recording = _Failing(), _Recording()
    trackers = Trackers([failing, recording])
    for step in (1, 2, 3):
        trackers.log(step, {"loss": 1.0})
    trackers.close()
    assert failing.calls == 1 and recording.steps == [1, 2, 3] and recording.closed
    warnings = [r for r in caplog.records if "tracker failing failed" in r.getMessage()]
    assert len(warnings) == 1 and "No space left on device" in warnings[0].getMessage()
