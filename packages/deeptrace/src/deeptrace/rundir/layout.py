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
SAMPLES_FILE = "samples.jsonl"  # greedy continuations at each evaluation (xtrain.train.sample_record)
RANKS_DIR = "ranks"
TRACE_DIR = "trace"
HEARTBEAT_DIR = "heartbeat"
PROFILER_DIR = "profiler"
CHECKPOINTS_DIR = "checkpoints"
LOGS_DIR = "logs"
HF_DIR = "hf"
REPORT_DIR = "deeptrace"  # what `deeptrace analyze` and `deeptrace watch` write
REPORT_FILE = "report.json"  # `deeptrace analyze`'s report (deeptrace.report.model), in REPORT_DIR
FLIGHT_RECORDER_DIR = "flight_recorder"  # PyTorch Flight Recorder dumps, one per rank (TORCH_FR_DUMP_TEMP_FILE)
STACKS_DIR = "stacks"  # the in-process stack dumps of the ranks (Collector, on a signal)
HANG_DIR_PREFIX = "hang-"  # deeptrace/hang-<UTC time>/: one diagnosed hang of `deeptrace watch`
WATCH_DIR = "watch"  # deeptrace/watch/: stack requests to the per-node helpers and their answers
VERDICT_FILE = "verdict.json"
CHECKPOINT_COMPLETE_MARKER = "COMPLETE"

TRACE_SUFFIX = ".dtr"  # deeptrace's binary span records
CLOCK_SUFFIX = ".clock.json"

_RANK_FILE = re.compile(r"^rank-(\d+)(\..+)$")
_ATTEMPT_FILE = re.compile(r"^rank-(\d+)\.attempt-(\d+)(\..+)$")
_TRAILING_RANK = re.compile(r"(\d+)(?:\.pickle|\.pkl)?$")
_STEP_DIR = re.compile(r"^step-(\d+)$")


def config_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / CONFIG_FILE


def meta_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / META_FILE


def metrics_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / METRICS_FILE


def samples_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / SAMPLES_FILE


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


def attempt_trace_path(run_dir: Path | str, rank: int, attempt: int) -> Path:
    """An earlier attempt's trace of a restarted rank, set aside by the Collector (attempts count from 1)."""
    return trace_dir(run_dir) / f"rank-{rank}.attempt-{attempt}{TRACE_SUFFIX}"


def attempt_clock_path(run_dir: Path | str, rank: int, attempt: int) -> Path:
    return trace_dir(run_dir) / f"rank-{rank}.attempt-{attempt}{CLOCK_SUFFIX}"


def current_traces(run_dir: Path | str) -> dict[int, Path]:
    """Every rank's trace of its current attempt (rank-R.dtr), keyed by rank; never a set-aside attempt."""
    found: dict[int, Path] = {}
    folder = trace_dir(run_dir)
    if folder.is_dir():
        for child in folder.iterdir():
            match = _RANK_FILE.match(child.name)
            if match and match.group(2) == TRACE_SUFFIX and child.is_file():
                found[int(match.group(1))] = child
    return dict(sorted(found.items()))


def earlier_attempts(run_dir: Path | str) -> dict[int, dict[int, Path]]:
    """The set-aside traces of restarted ranks: rank -> attempt -> path, both ascending."""
    found: dict[int, dict[int, Path]] = {}
    folder = trace_dir(run_dir)
    if folder.is_dir():
        for child in folder.iterdir():
            match = _ATTEMPT_FILE.match(child.name)
            if match and match.group(3) == TRACE_SUFFIX and child.is_file():
                found.setdefault(int(match.group(1)), {})[int(match.group(2))] = child
    return {rank: dict(sorted(attempts.items())) for rank, attempts in sorted(found.items())}


def next_attempt(run_dir: Path | str, rank: int) -> int:
    """The number the current trace of `rank` gets when it is set aside: one more than the last set aside."""
    return max(earlier_attempts(run_dir).get(rank, {}), default=0) + 1


def flight_recorder_dir(run_dir: Path | str) -> Path:
    """PyTorch Flight Recorder dumps: point TORCH_FR_DUMP_TEMP_FILE at `<this folder>/rank_` and each rank's
    dump lands as rank_<R>."""
    return Path(run_dir) / FLIGHT_RECORDER_DIR


def flight_recorder_dumps(run_dir: Path | str) -> dict[int, Path]:
    """Every rank's Flight Recorder dump, keyed by the rank at the end of its name (rank_3, rank-3, ..._3)."""
    folder = flight_recorder_dir(run_dir)
    found: dict[int, Path] = {}
    if folder.is_dir():
        for child in folder.iterdir():
            match = _TRAILING_RANK.search(child.name)
            if match and child.is_file() and not child.name.startswith("."):
                found[int(match.group(1))] = child
    return dict(sorted(found.items()))


def stacks_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / STACKS_DIR


def stack_dump_path(run_dir: Path | str, rank: int) -> Path:
    """Where the rank's in-process stack dump (faulthandler, on its stack signal) appends its text."""
    return stacks_dir(run_dir) / f"rank-{rank}.txt"


def hang_dir(run_dir: Path | str, stamp: str) -> Path:
    """One hang diagnosed by `deeptrace watch`: stacks per rank and verdict.json (`stamp`: UTC, sortable)."""
    return report_dir(run_dir) / f"{HANG_DIR_PREFIX}{stamp}"


def hang_dirs(run_dir: Path | str) -> list[Path]:
    """Every hang folder with a verdict, oldest first."""
    folder = report_dir(run_dir)
    if not folder.is_dir():
        return []
    return sorted(
        child
        for child in folder.iterdir()
        if child.name.startswith(HANG_DIR_PREFIX) and (child / VERDICT_FILE).is_file()
    )


def watch_dir(run_dir: Path | str) -> Path:
    return report_dir(run_dir) / WATCH_DIR


def stack_requests_dir(run_dir: Path | str) -> Path:
    """Stack requests of `deeptrace watch` to the per-node helpers (`deeptrace watch --node`), and their answers."""
    return watch_dir(run_dir) / "requests"


def node_helpers_dir(run_dir: Path | str) -> Path:
    """One file per running node helper, rewritten while it lives: which hosts have one."""
    return watch_dir(run_dir) / "nodes"


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


def checkpoint_step(folder: Path | str) -> int | None:
    """N for a folder named ``step-N`` (a checkpoint's, or an HF export's), else None."""
    match = _STEP_DIR.match(Path(folder).name)
    return int(match.group(1)) if match else None


def checkpoint_step_folders(run_dir: Path | str) -> list[tuple[int, Path]]:
    """Every ``checkpoints/step-N`` folder of a run, complete or not, by ascending step."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = [(step, child) for child in root.iterdir() if (step := checkpoint_step(child)) is not None]
    return sorted(found)


def completed_checkpoint_steps(run_dir: Path | str) -> list[int]:
    """Steps whose checkpoint carries its completion marker, ascending."""
    return [
        step for step, folder in checkpoint_step_folders(run_dir) if (folder / CHECKPOINT_COMPLETE_MARKER).is_file()
    ]


def logs_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / LOGS_DIR


def log_path(run_dir: Path | str, rank: int) -> Path:
    return logs_dir(run_dir) / f"rank-{rank}.log"


def hf_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / HF_DIR


def hf_export_dir(run_dir: Path | str, step: int) -> Path:
    """RUN_DIR/hf/step-N: the Hugging Face folder exported from step N's checkpoint."""
    return hf_dir(run_dir) / f"step-{step}"


def report_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / REPORT_DIR


def report_path(run_dir: Path | str) -> Path:
    """RUN_DIR/deeptrace/report.json, where `deeptrace analyze RUN_DIR` writes its report by default."""
    return report_dir(run_dir) / REPORT_FILE


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
