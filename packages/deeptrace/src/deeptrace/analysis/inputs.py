"""What `deeptrace analyze RUN_DIR` reads: an xtrain run directory, or simply a folder of Kineto traces."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from deeptrace.rundir import layout

KINETO_SUFFIXES = (".json", ".json.gz")


class NoInputError(ValueError):
    """RUN_DIR holds nothing deeptrace can analyse."""


@dataclass
class Inputs:
    run_dir: Path
    kineto: list[Path] = field(default_factory=list)
    collector: list[Path] = field(default_factory=list)
    # Set-aside traces of restarted ranks (rank -> attempt -> path): reported as such, never analysed as the rank.
    earlier_attempts: dict[int, dict[int, Path]] = field(default_factory=dict)
    is_run_dir: bool = False  # an xtrain run directory (meta.json, trace/, heartbeat/ or profiler/)

    @property
    def files(self) -> list[tuple[Path, str]]:
        return [(p, "kineto") for p in self.kineto] + [(p, "collector") for p in self.collector]


def _is_trace_candidate(path: Path) -> bool:
    name = path.name
    return path.is_file() and name.endswith(KINETO_SUFFIXES) and not name.endswith(layout.CLOCK_SUFFIX)


def discover_inputs(run_dir: Path) -> Inputs:
    """Find the input files; NoInputError (with what was looked for) when there are none."""
    if not run_dir.exists():
        raise NoInputError(f"{run_dir}: no such directory")
    if not run_dir.is_dir():
        raise NoInputError(f"{run_dir}: not a directory (give the run directory or a folder of Kineto traces)")
    inputs = Inputs(run_dir=run_dir)
    markers = (
        layout.meta_path(run_dir),
        layout.trace_dir(run_dir),
        layout.heartbeat_dir(run_dir),
        layout.flight_recorder_dir(run_dir),
    )
    profiler = layout.profiler_dir(run_dir)
    inputs.is_run_dir = any(p.exists() for p in markers) or profiler.is_dir()
    if profiler.is_dir():
        inputs.kineto = sorted(p for p in profiler.rglob("*") if _is_trace_candidate(p))
    if not inputs.is_run_dir:
        inputs.kineto = sorted(p for p in run_dir.iterdir() if _is_trace_candidate(p))
    # The layout knows the file names: the current attempt's trace of each rank, and the earlier attempts apart.
    inputs.collector = list(layout.current_traces(run_dir).values())
    inputs.earlier_attempts = layout.earlier_attempts(run_dir)
    has_heartbeats = layout.heartbeat_dir(run_dir).is_dir() and any(layout.heartbeat_dir(run_dir).iterdir())
    if not inputs.files and not has_heartbeats and not layout.flight_recorder_dumps(run_dir):
        raise NoInputError(
            f"{run_dir}: nothing to analyse: no Kineto traces (*.json, *.json.gz here or in profiler/), no collector"
            f" traces (trace/rank-N{layout.TRACE_SUFFIX}) and no heartbeats (heartbeat/)"
        )
    return inputs
