"""Weights & Biases, offline: a run in RUN_DIR/wandb for ``wandb sync`` later. Its id is kept in
RUN_DIR/wandb/xtrain-run.json with the last step logged, so a resumed run continues the same W&B run and logs
only the steps after that one."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from clusterx.fileio import write_atomically

from xtrain.config import TrainConfig
from xtrain.train.tracking.params import config_params

WANDB_DIR = "wandb"
STATE_FILE = "xtrain-run.json"


class WandbTracker:
    name = "wandb"

    def __init__(self, run_dir: Path, config: TrainConfig, config_name: str) -> None:
        import wandb  # noqa: PLC0415 (the optional extra)

        folder = run_dir / WANDB_DIR
        folder.mkdir(parents=True, exist_ok=True)
        self._state_path = folder / STATE_FILE
        state = json.loads(self._state_path.read_text()) if self._state_path.exists() else {}
        self.run_id: str = state.get("id") or uuid.uuid4().hex[:8]
        self.last_step: int = int(state.get("last_step", 0))
        settings = wandb.Settings(mode="offline", console="off", silent=True, x_disable_stats=True)
        self._run: Any = wandb.init(
            dir=str(run_dir), project=config_name, name=run_dir.name, id=self.run_id, resume="allow",
            config=config_params(config), settings=settings,
        )  # fmt: skip
        self._save_state()

    def log(self, step: int, scalars: dict[str, float]) -> None:
        if step <= self.last_step:
            return  # logged by the interrupted attempt, with the value an exact resume gives again
        self._run.log(scalars, step=step)
        self.last_step = step
        self._save_state()

    def close(self) -> None:
        self._run.finish()

    def _save_state(self) -> None:
        write_atomically(self._state_path, json.dumps({"id": self.run_id, "last_step": self.last_step}), fsync=False)
