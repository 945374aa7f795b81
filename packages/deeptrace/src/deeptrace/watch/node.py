"""Stacks of ranks on other nodes: a small helper per node answers requests left in the shared run directory.

    deeptrace watch RUN_DIR --node     # on every node of the job (srun --ntasks-per-node=1 ..., see docs)

The watcher (anywhere that sees the run directory) writes `deeptrace/watch/requests/<id>.<host>.json`: which
ranks, how many snapshots, how far apart, and the folder for the answers. The helper of that host (the host name
the ranks' heartbeats carry) takes its stack snapshots locally, where it may attach to its ranks (py-spy) or
signal them, writes them as `rank-R.stacks.json` into that folder, and then `<id>.<host>.done`. Each helper
announces itself in `deeptrace/watch/nodes/<host>.json` (rewritten every few seconds), so the watcher waits only
for hosts that have one and otherwise says that ranks there could not be reached.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson

from deeptrace.rundir import layout, read_heartbeats
from deeptrace.rundir.jsonio import dumps, write_atomically
from deeptrace.rundir.records import Heartbeat
from deeptrace.rundir.writer import host_name
from deeptrace.watch.capture import CaptureConfig, capture_local
from deeptrace.watch.stacks import StackSnapshot
from deeptrace.watch.verdict import RankStacks

HELPER_FRESH_S = 10.0  # a helper file older than this belongs to a helper that is gone
ANNOUNCE_EVERY_S = 2.0
STACKS_SUFFIX = ".stacks.json"


def stacks_file(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank}{STACKS_SUFFIX}"


def write_rank_stacks(folder: Path, stacks: RankStacks) -> None:
    payload = {
        "rank": stacks.rank,
        "thread_id": stacks.thread_id,
        "error": stacks.error,
        "snapshots": [s.to_dict() for s in stacks.snapshots],
    }
    write_atomically(stacks_file(folder, stacks.rank), dumps(payload, indent=True))


def read_rank_stacks(folder: Path, rank: int) -> RankStacks | None:
    try:
        obj = orjson.loads(stacks_file(folder, rank).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
    snapshots = [StackSnapshot.from_dict(s) for s in obj["snapshots"]]
    return RankStacks(obj["rank"], snapshots, obj.get("thread_id"), obj.get("error"))


def helper_alive(run_dir: Path, host: str, now: float | None = None) -> bool:
    path = layout.node_helpers_dir(run_dir) / f"{host}.json"
    try:
        return (time.time() if now is None else now) - path.stat().st_mtime < HELPER_FRESH_S
    except FileNotFoundError:
        return False


def request_remote(
    run_dir: Path, host: str, beats: dict[int, Heartbeat], config: CaptureConfig, folder: Path | None = None
) -> dict[int, RankStacks]:
    """Ask `host`'s helper for the stacks of `beats`' ranks; waits for its answer (bounded)."""
    missing = f"on host {host}, where no `deeptrace watch --node` helper runs"
    if not helper_alive(run_dir, host):
        return {r: RankStacks(r, [], b.thread_id, missing) for r, b in beats.items()}
    requests = layout.stack_requests_dir(run_dir)
    requests.mkdir(parents=True, exist_ok=True)
    answers = folder or requests / f"answers-{uuid.uuid4().hex[:8]}"
    answers.mkdir(parents=True, exist_ok=True)
    request_id = uuid.uuid4().hex[:12]
    request = {
        "id": request_id,
        "host": host,
        "ranks": sorted(beats),
        "snapshots": config.snapshots,
        "gap_s": config.gap_s,
        "method": config.method,
        "answers": str(answers),
        "created_wall_s": time.time(),
    }
    write_atomically(requests / f"{request_id}.{host}.json", dumps(request))
    done = requests / f"{request_id}.{host}.done"
    deadline = time.monotonic() + config.snapshots * config.gap_s + config.remote_timeout_s
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    found: dict[int, RankStacks] = {}
    for rank, beat in beats.items():
        stacks = read_rank_stacks(answers, rank) if done.exists() else None
        found[rank] = stacks or RankStacks(rank, [], beat.thread_id, f"the helper on {host} did not answer in time")
    with contextlib.suppress(FileNotFoundError):
        done.unlink()
    return found


def serve(run_dir: Path, *, poll_s: float = 0.2, stop: Callable[[], bool] | None = None,
          say: Callable[[str], None] | None = None) -> None:  # fmt: skip
    """Answer stack requests for this host's ranks until `stop()` says so (or forever)."""
    host = host_name()
    helpers = layout.node_helpers_dir(run_dir)
    requests = layout.stack_requests_dir(run_dir)
    helpers.mkdir(parents=True, exist_ok=True)
    requests.mkdir(parents=True, exist_ok=True)
    me = helpers / f"{host}.json"
    announced = 0.0
    try:
        while stop is None or not stop():
            if time.monotonic() - announced > ANNOUNCE_EVERY_S:
                # Rewritten every few seconds, only ever read live: no fsync.
                write_atomically(me, dumps({"host": host, "pid": os.getpid(), "wall_s": time.time()}), fsync=False)
                announced = time.monotonic()
            for path in sorted(requests.glob(f"*.{host}.json")):
                _answer(run_dir, path, host, say)
            time.sleep(poll_s)
    finally:
        with contextlib.suppress(FileNotFoundError):
            me.unlink()


def _answer(run_dir: Path, path: Path, host: str, say: Callable[[str], None] | None) -> None:
    try:
        request = orjson.loads(path.read_bytes())
        path.unlink()  # taken: another helper of the same name (a restart) must not answer it twice
    except (FileNotFoundError, orjson.JSONDecodeError):
        return
    beats = {r: b for r, b in read_heartbeats(run_dir, errors={}).items() if r in request["ranks"] and b.host == host}
    config = CaptureConfig(snapshots=int(request["snapshots"]), gap_s=float(request["gap_s"]),
                           method=request.get("method", "auto"))  # fmt: skip
    if say is not None:
        say(f"stack request {request['id']}: ranks {sorted(beats)}, {config.snapshots} snapshots")
    answers = Path(request["answers"])
    for stacks in capture_local(run_dir, beats, config).values():
        write_rank_stacks(answers, stacks)
    write_atomically(path.with_name(f"{request['id']}.{host}.done"), b"{}")
