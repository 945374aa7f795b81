"""MLflow: the experiment named after the config, the run after the run directory, the resolved config as
parameters and the step scalars as metrics. The run directory keeps the MLflow run's id (RUN_DIR/mlflow-run.json):
a resumed run continues that run and logs only the steps after the last one it holds."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from clusterx.fileio import write_atomically

from xtrain.config import TrainConfig
from xtrain.train.tracking.params import config_params

RUN_DIR_TAG = "xtrain.run_dir"
STATE_FILE = "mlflow-run.json"
"""In the run directory: the MLflow run it reports to, so that a resume (or a copy of the directory) continues it."""


class MlflowTracker:
    name = "mlflow"

    def __init__(self, uri: str, config: TrainConfig, run_dir: Path, config_name: str) -> None:
        from mlflow.tracking import MlflowClient  # noqa: PLC0415 (the optional extra)

        if "://" not in uri:
            # A local folder: MLflow 3 keeps its file store only on request (it steers users to SQLite), and a
            # folder is what the config asked for.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._client = MlflowClient(tracking_uri=uri)
        experiment = self._client.get_experiment_by_name(config_name)
        experiment_id = experiment.experiment_id if experiment else self._client.create_experiment(config_name)
        self._state_path = run_dir / STATE_FILE
        self.run_id, self.last_step = self._continued(experiment_id) or self._created(experiment_id, config, run_dir)
        write_atomically(self._state_path, json.dumps({"run_id": self.run_id, "tracking_uri": uri}), fsync=False)

    def _continued(self, experiment_id: str) -> tuple[str, int] | None:
        """The MLflow run this run directory reported to before (its id is kept in the run directory), and the
        last step it holds; None when there is none in this store."""
        if not self._state_path.exists():
            return None
        run_id = json.loads(self._state_path.read_text()).get("run_id")
        found = self._client.search_runs([experiment_id], filter_string=f"attributes.run_id = '{run_id}'")
        if not found:
            return None
        history = self._client.get_metric_history(run_id, "loss")
        self._client.update_run(run_id, status="RUNNING")
        return run_id, max((metric.step for metric in history), default=0)

    def _created(self, experiment_id: str, config: TrainConfig, run_dir: Path) -> tuple[str, int]:
        from mlflow.entities import Param  # noqa: PLC0415

        run = self._client.create_run(experiment_id, run_name=run_dir.name, tags={RUN_DIR_TAG: str(run_dir.resolve())})
        params = [Param(key, value) for key, value in config_params(config).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 parameters per batch
            self._client.log_batch(run.info.run_id, params=params[start : start + 100])
        return run.info.run_id, 0

    def log(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric  # noqa: PLC0415

        if step <= self.last_step:
            return  # the interrupted attempt logged it already, with the value an exact resume gives again
        stamp = int(time.time() * 1000)
        metrics = [Metric(name.replace("/", "_"), value, stamp, step) for name, value in scalars.items()]
        self._client.log_batch(self.run_id, metrics=metrics)
        self.last_step = step

    def close(self) -> None:
        self._client.set_terminated(self.run_id)
