"""Where every file of a run directory lives: the ONE place these paths are spelled.

Writers, readers, the analyser and the dashboard all call these helpers; nothing else joins path strings by hand.
The layout and every field of every file are specified in docs/run-directory.md.
"""

from __future__ import annotations

import re
from pathlib import Path

# Version of the run-directory format. meta.json, heartbeats and clock references carry it; a reader refuses a
# newer major version with a message instead of misreading it.
FORMAT_VERSION = 1

CONFIG_FILE = "config.toml"
META_FILE = "meta.json"
METRICS_FILE = "metrics.jsonl"
RANKS_DIR = "ranks"
TRACE_DIR = "trace"
HEARTBEAT_DIR = "heartbeat"
PROFILER_DIR = "profiler"
CHECKPOINTS_DIR = "checkpoints"
LOGS_DIR = "logs"
HF_DIR = "hf"
REPORT_DIR = "deeptrace"  # what `deeptrace analyze` writes
CHECKPOINT_COMPLETE_MARKER = "COMPLETE"

TRACE_SUFFIX = ".dtr"  # deeptrace's binary span records
CLOCK_SUFFIX = ".clock.json"

_RANK_FILE = re.compile(r"^rank-(\d+)(\..+)$")
_STEP_DIR = re.compile(r"^step-(\d+)$")


def config_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / CONFIG_FILE


def meta_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / META_FILE


def metrics_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / METRICS_FILE


def ranks_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / RANKS_DIR


def rank_records_path(run_dir: Path | str, rank: int) -> Path:
    return ranks_dir(run_dir) / f"rank-{rank}.jsonl"


def trace_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / TRACE_DIR


def trace_path(run_dir: Path | str, rank: int) -> Path:
    """The rank's span records written by `deeptrace.collect.Collector`."""
    return trace_dir(run_dir) / f"rank-{rank}{TRACE_SUFFIX}"


def clock_path(run_dir: Path | str, rank: int) -> Path:
    """The rank's clock reference (wall and monotonic clock read together), beside its trace."""
    return trace_dir(run_dir) / f"rank-{rank}{CLOCK_SUFFIX}"


def heartbeat_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / HEARTBEAT_DIR


def heartbeat_path(run_dir: Path | str, rank: int) -> Path:
    return heartbeat_dir(run_dir) / f"rank-{rank}.json"


def profiler_dir(run_dir: Path | str) -> Path:
    """PyTorch profiler (Kineto) traces, one file per rank, any name (recognised by content)."""
    return Path(run_dir) / PROFILER_DIR


def checkpoints_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR


def checkpoint_dir(run_dir: Path | str, step: int) -> Path:
    return checkpoints_dir(run_dir) / f"step-{step}"


def checkpoint_complete_marker(run_dir: Path | str, step: int) -> Path:
    """Written last, after every rank finished saving: a checkpoint without it is incomplete and never loaded."""
    return checkpoint_dir(run_dir, step) / CHECKPOINT_COMPLETE_MARKER


def completed_checkpoint_steps(run_dir: Path | str) -> list[int]:
    """Steps whose checkpoint carries its completion marker, ascending."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / CHECKPOINT_COMPLETE_MARKER).is_file():
            steps.append(int(match.group(1)))
    return sorted(steps)


def logs_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / LOGS_DIR


def log_path(run_dir: Path | str, rank: int) -> Path:
    return logs_dir(run_dir) / f"rank-{rank}.log"


def hf_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / HF_DIR


def report_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / REPORT_DIR


def rank_of_file(path: Path | str) -> int | None:
    """The rank R of a file named `rank-{R}.<suffix>`, else None."""
    match = _RANK_FILE.match(Path(path).name)
    return int(match.group(1)) if match else None


def _ranks_in(folder: Path, suffix: str) -> set[int]:
    if not folder.is_dir():
        return set()
    found = set()
    for child in folder.iterdir():
        match = _RANK_FILE.match(child.name)
        if match and match.group(2) == suffix:
            found.add(int(match.group(1)))
    return found


def discover_ranks(run_dir: Path | str) -> list[int]:
    """Every rank that left any per-rank file (records, trace, clock, heartbeat, log), ascending.

    Ranks are discovered from the files, not from meta.json's world size, so a rank that never wrote anything is
    absent here; compare with `RunMeta.world_size` to find it.
    """
    run_dir = Path(run_dir)
    ranks = (
        _ranks_in(ranks_dir(run_dir), ".jsonl")
        | _ranks_in(trace_dir(run_dir), TRACE_SUFFIX)
        | _ranks_in(trace_dir(run_dir), CLOCK_SUFFIX)
        | _ranks_in(heartbeat_dir(run_dir), ".json")
        | _ranks_in(logs_dir(run_dir), ".log")
    )
    return sorted(ranks)
