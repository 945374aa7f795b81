"""The dashboard's panels. Each one only draws what `xtop.sources` / `xtop.resources` hand it."""

from __future__ import annotations

from typing import Any

from textual.widgets import DataTable, Static

from xtop.resources import ResourceSample
from xtop.sources import RunSnapshot

GIB = 1024**3


class ResourcesPanel(Static):
    """CPU, memory and GPUs of this machine."""

    def show(self, sample: ResourceSample) -> None:
        lines = [
            f"CPU  {sample.cpu_pct:5.1f}% of {sample.cpu_count} cores",
            f"MEM  {sample.memory_used_bytes / GIB:6.1f} / {sample.memory_total_bytes / GIB:.1f} GiB"
            f" ({sample.memory_pct:.0f}%)",
        ]
        if sample.gpus:
            lines += [
                f"GPU{gpu.index} {gpu.name}: {gpu.utilization_pct:.0f}%,"
                f" {gpu.memory_used_bytes / GIB:.1f} / {gpu.memory_total_bytes / GIB:.1f} GiB"
                for gpu in sample.gpus
            ]
        else:
            lines.append(f"GPU  none ({sample.gpu_note})")
        self.update("\n".join(lines))


JOB_COLUMNS = ("id", "name", "user", "backend", "state", "attempt", "hosts", "run dir")


class JobsTable(DataTable[str]):
    """The newest clusterx jobs; the selected row's run directory is what the run panel follows."""

    def on_mount(self) -> None:
        self.run_dirs = {}
        self.cursor_type = "row"
        self.add_columns(*JOB_COLUMNS)

    run_dirs: dict[str, str | None]
    """Run directory of each shown job, by row key (the job id)."""

    def show(self, jobs: list[dict[str, Any]]) -> None:
        selected_key = self._selected_key()
        self.clear()
        self.run_dirs = {str(job["id"]): job.get("run_dir") for job in jobs}
        for job in jobs:
            self.add_row(
                str(job["id"]),
                str(job["name"]),
                str(job["user"]),
                str(job["backend"]),
                str(job["state"]),
                f"{job['attempt']}/{job['max_retries'] + 1}",
                ",".join(job.get("hosts") or []) or "-",
                str(job.get("run_dir") or "-"),
                key=str(job["id"]),
            )
        if selected_key is not None and selected_key in self.rows:
            self.move_cursor(row=self.get_row_index(selected_key))

    def _selected_key(self) -> str | None:
        if self.row_count == 0:
            return None
        return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value


class RunPanel(Static):
    """Progress of one run directory: the last metrics record, rank liveness, and deeptrace's findings."""

    def show(self, snap: RunSnapshot | None) -> None:
        if snap is None:
            self.update("No run directory selected (select a job with a run dir, or start xtop with --run-dir).")
            return
        lines = [f"[b]{snap.run_dir}[/b]", f"steps recorded: {snap.steps_seen}"]
        if snap.last_metrics:
            fields = "  ".join(f"{key}={_fmt(value)}" for key, value in snap.last_metrics.items())
            lines.append(f"last: {fields}")
        for rank in snap.ranks:
            stalled = "  [red]no progress[/red]" if rank.seconds_since_progress > 60 and rank.state == "running" else ""
            lines.append(
                f"rank {rank.rank}: step {rank.step} {rank.state}, last progress"
                f" {rank.seconds_since_progress:.0f}s ago{stalled}"
            )
        lines += snap.findings
        lines += [f"[red]{problem}[/red]" for problem in snap.problems]
        self.update("\n".join(lines))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
