"""Drive the real ``xtrain`` command line in subprocesses, find and kill its ranks, read what a run wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from tests.conftest import REPO_ROOT

XTRAIN = str(Path(sys.executable).parent / "xtrain")
DEBUG_CONFIG = REPO_ROOT / "examples" / "debug_moe.toml"
# Compared bit for bit between an interrupted and an uninterrupted run.
EXACT_KEYS = ("loss", "aux_loss", "z_loss", "grad_norm", "lr", "tokens")


def short_run(cache_dir: Path, *overrides: str) -> list[str]:
    """``--set`` options of a short exact run of examples/debug_moe.toml: 6 steps of 2 packs of 128 tokens, fp32,
    a checkpoint every 2 steps."""
    settings = (
        "train.max_steps=6",
        "train.global_batch=2",
        "data.pack_tokens=128",
        f"data.cache_dir={cache_dir}",
        'parallel.mixed_precision="fp32"',
        "trace.profile_steps=[]",
        "checkpoint.every_steps=2",
        *overrides,
    )
    return [arg for setting in settings for arg in ("--set", setting)]


def environment(**extra: str) -> dict[str, str]:
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": os.environ.get("HOME", "/root")}
    env.update(extra)
    return env


def xtrain(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [XTRAIN, *map(str, args)], capture_output=True, text=True, timeout=600, check=False, cwd=cwd,
        env=env or environment(),
    )  # fmt: skip


def start_xtrain(*args: str | Path, cwd: Path, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("wb") as output:
        return subprocess.Popen(
            [XTRAIN, *map(str, args)], cwd=cwd, stdout=output, stderr=subprocess.STDOUT, env=env or environment()
        )


def rank_process(root_pid: int, rank: int, timeout_s: float = 120.0) -> psutil.Process:
    """The training process of ``rank`` among ``root_pid``'s descendants (torchrun's children carry RANK)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            for child in psutil.Process(root_pid).children(recursive=True):
                try:
                    env = child.environ()
                    if env.get("RANK") == str(rank) and "xtrain" in " ".join(child.cmdline()):
                        return child
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    raise AssertionError(f"no process of rank {rank} under pid {root_pid}")


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return read_jsonl(run_dir / "metrics.jsonl")


def steps_logged(run_dir: Path) -> set[int]:
    return {record["step"] for record in metrics(run_dir)}


def latest_per_step(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """A resumed run appends: a step may appear twice, the later record counts (docs/run-directory.md)."""
    return {record["step"]: record for record in records}


def pack_ids(run_dir: Path, world_size: int) -> dict[int, list[int]]:
    """Step -> the packs all ranks trained on in it (their latest records), in rank order."""
    per_rank = [latest_per_step(read_jsonl(run_dir / "ranks" / f"rank-{r}.jsonl")) for r in range(world_size)]
    steps = sorted(set().union(*per_rank))
    return {step: [pack for records in per_rank for pack in records[step]["pack_ids"]] for step in steps}


def complete(run_dir: Path, step: int) -> bool:
    return (run_dir / "checkpoints" / f"step-{step}" / "COMPLETE").is_file()
