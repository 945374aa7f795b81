"""RUN_DIR/deeptrace/hang-<UTC time>/: what `deeptrace watch` found about one hang.

verdict.json          the verdict (schema `deeptrace.hang`): culprit ranks with file:line and evidence
rank-R.stacks.json    every snapshot of rank R (all threads, frames innermost first), as captured
rank-R.txt            the same for people: the training thread first
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import orjson

from deeptrace.rundir import layout
from deeptrace.rundir.jsonio import dumps, write_atomically
from deeptrace.watch.node import write_rank_stacks
from deeptrace.watch.verdict import RankStacks, Verdict


def new_hang_dir(run_dir: Path) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    folder = layout.hang_dir(run_dir, stamp)
    folder.mkdir(parents=True, exist_ok=False)
    return folder


def write_stacks(folder: Path, stacks: dict[int, RankStacks]) -> None:
    for rank_stacks in stacks.values():
        write_rank_stacks(folder, rank_stacks)
        (folder / f"rank-{rank_stacks.rank}.txt").write_text(_text(rank_stacks), encoding="utf-8")


def write_verdict(folder: Path, verdict: Verdict, run_dir: Path) -> Path:
    path = folder / layout.VERDICT_FILE
    write_atomically(path, dumps(verdict.to_dict(str(run_dir)), indent=True))
    return path


def read_verdict(folder: Path) -> dict[str, Any]:
    obj: dict[str, Any] = orjson.loads((folder / layout.VERDICT_FILE).read_bytes())
    return obj


def _text(stacks: RankStacks) -> str:
    lines = [f"rank {stacks.rank}"]
    if stacks.error:
        lines.append(f"no stack: {stacks.error}")
    for index, snapshot in enumerate(stacks.snapshots):
        when = dt.datetime.fromtimestamp(snapshot.wall_s, dt.UTC).strftime("%H:%M:%S.%f")[:-3]
        lines.append(f"\n== snapshot {index + 1} at {when} UTC ({snapshot.method})")
        lines += [f"   note: {note}" for note in snapshot.notes]
        training = snapshot.thread(stacks.thread_id)
        ordered = ([training] if training else []) + [t for t in snapshot.threads if t is not training]
        for thread in ordered:
            label = "training thread" if thread is training else (thread.name or "thread")
            ident = "?" if thread.thread_id is None else hex(thread.thread_id)
            lines.append(f"-- {label} {ident}")
            lines += [f"    {frame}" for frame in thread.frames]
    return "\n".join(lines) + "\n"
