"""TensorBoard: event files in RUN_DIR/tensorboard/, written through torch's SummaryWriter."""

from __future__ import annotations

from pathlib import Path

TENSORBOARD_DIR = "tensorboard"


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, run_dir: Path, start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 (the optional extra)

        # After a resume from step k, TensorBoard's readers drop the events of steps > k that the interrupted
        # attempt wrote: the resumed run continues the same curves with no step twice.
        purge = start_step + 1 if start_step else None
        self._writer = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR), purge_step=purge)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for name, value in scalars.items():
            self._writer.add_scalar(name, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
