"""Several stack snapshots of every stopped rank, some seconds apart: local ranks directly, others through the
per-node helpers (`deeptrace watch --node`, see `deeptrace.watch.node`) over the shared run directory."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from deeptrace.rundir.records import Heartbeat
from deeptrace.rundir.writer import host_name
from deeptrace.watch.stacks import Method, StackError, StackSnapshot, capture_stack
from deeptrace.watch.verdict import RankStacks


@dataclass(frozen=True)
class CaptureConfig:
    snapshots: int = 3
    gap_s: float = 2.0
    method: Method = "auto"
    remote_timeout_s: float = 30.0  # extra time a node helper gets beyond the snapshots themselves


def capture_local(run_dir: Path, beats: dict[int, Heartbeat], config: CaptureConfig) -> dict[int, RankStacks]:
    """`config.snapshots` rounds, `config.gap_s` apart; in each round every rank at once (one thread each)."""
    taken: dict[int, list[StackSnapshot]] = {rank: [] for rank in beats}
    errors: dict[int, str] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(beats)))) as pool:
        for index in range(config.snapshots):
            if index:
                time.sleep(config.gap_s)
            live = [r for r in beats if r not in errors]
            # Native frames in the first round only: reading libtorch's symbols takes seconds, and the comparison
            # over time needs only the Python frames.
            native = index == 0
            results = pool.map(_one, [run_dir] * len(live), [beats[r] for r in live], [config.method] * len(live),
                               [native] * len(live))  # fmt: skip
            for rank, result in zip(live, results, strict=True):
                if isinstance(result, str):
                    errors[rank] = result
                else:
                    taken[rank].append(result)
    return {rank: RankStacks(rank, taken[rank], beats[rank].thread_id, errors.get(rank)) for rank in sorted(beats)}


def _one(run_dir: Path, beat: Heartbeat, method: Method, native: bool) -> StackSnapshot | str:
    try:
        return capture_stack(run_dir, beat, method, native=native)
    except StackError as error:
        return str(error)


def capture_all(
    run_dir: Path, beats: dict[int, Heartbeat], config: CaptureConfig, folder: Path
) -> dict[int, RankStacks]:
    """Every rank's stacks: those on this host here, the others by their node's helper (when one runs), which
    writes its answers into `folder` (the hang folder)."""
    from deeptrace.watch.node import request_remote  # noqa: PLC0415  # node.py imports this module

    here = host_name()
    local = {r: b for r, b in beats.items() if b.host == here}
    by_host: dict[str, dict[int, Heartbeat]] = {}
    for rank, beat in beats.items():
        if beat.host != here:
            by_host.setdefault(beat.host, {})[rank] = beat
    with ThreadPoolExecutor(max_workers=1 + len(by_host)) as pool:
        futures = [pool.submit(capture_local, run_dir, local, config)] if local else []
        futures += [
            pool.submit(request_remote, run_dir, host, ranks, config, folder) for host, ranks in by_host.items()
        ]
        found: dict[int, RankStacks] = {}
        for future in futures:
            found.update(future.result())
    return dict(sorted(found.items()))
