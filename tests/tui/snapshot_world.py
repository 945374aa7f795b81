"""A fixed world for the snapshot tests: a clusterx database whose jobs have fixed times, and a run directory
whose records, heartbeats and report carry fixed values, all at fixed paths, so every screen draws the same
pixels on every machine. The files follow the documented formats (docs/run-directory.md, the job record);
they are written directly only because their writers stamp the current time."""

from __future__ import annotations

import math
import shutil
from datetime import timedelta
from pathlib import Path

import orjson
from clusterx import Client
from clusterx.db.models import Job
from clusterx.spec import JobSpec
from deeptrace.rundir import layout
from sqlalchemy import insert

from tests.tui.builders import FIXED_NOW
from tests.tui.reports import report_json

BASE = Path("/tmp/xtop-snapshot-world")
RUN_DIR = BASE / "runs" / "moe-pretrain"
NOW_S = FIXED_NOW.timestamp()

JOBS = (  # name, user, state, backend, nodes, gpus per node, minutes ago created, minutes run (None: not started)
    ("moe-pretrain", "alice", "RUNNING", "slurm", 4, 8, 95, 90),
    ("moe-sweep-lr3e-4", "alice", "QUEUED", "slurm", 2, 8, 20, None),
    ("eval-gsm8k", "bob", "SUCCEEDED", "local", 1, 1, 300, 42),
    ("dense-0.6b-smoke", "bob", "FAILED", "local", 1, 0, 1500, 3),
    ("tokenise-corpus", "carol", "CANCELLED", "slurm", 1, 0, 4000, 61),
)


def build_world() -> tuple[str, Path]:
    shutil.rmtree(BASE, ignore_errors=True)
    BASE.mkdir(parents=True)
    db = str(BASE / "jobs.db")
    client = Client(db, runs_dir=BASE / "runs")
    spec = JobSpec(command=["xtrain", "train", "moe.toml"], workdir="/work", run_dir=str(RUN_DIR))
    rows = []
    for i, (name, user, state, backend, nodes, gpus, ago_min, ran_min) in enumerate(JOBS):
        created = FIXED_NOW - timedelta(minutes=ago_min)
        started = created + timedelta(minutes=5) if ran_min is not None else None
        ended = started + timedelta(minutes=ran_min) if started and state != "RUNNING" and ran_min else None
        job_spec = spec.model_copy(update={"nodes": nodes, "gpus_per_node": gpus, "procs_per_node": max(gpus, 1),
                                           "name": name})  # fmt: skip
        rows.append({
            "submit_key": f"snap-{i}", "name": name, "user": user, "submit_host": "login-1", "backend": backend,
            "state": state, "spec": job_spec.model_dump(mode="json"),
            "run_dir": str(RUN_DIR if i == 0 else BASE / "runs" / name), "log_paths": {},
            "hosts": [f"gpu-{n:02d}" for n in range(nodes)] if started else [], "rank_to_host": {},
            "attempt": 1, "max_retries": 1 if i == 0 else 0, "priority": 0, "nodes": nodes, "cpus": 1, "gpus": gpus,
            "mem_mib": 0, "cancel_requested": False, "created_at": created, "updated_at": created,
            "started_at": started, "ended_at": ended,
        })  # fmt: skip
    with client.store.engine.begin() as connection:
        connection.execute(insert(Job), rows)
    client.close()
    _write_run()
    return db, RUN_DIR


def _jsonl(path: Path, records: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in records))


def _write_run() -> None:
    steps = 120
    start = NOW_S - steps * 2.0
    meta = {"format": "deeptrace-run", "format_version": 1, "run_id": "snapshot", "start_time": "2026-12-01T11:56:00Z",
            "start_time_unix_s": start, "world_size": 2, "hosts": ["gpu-00"], "rank_hosts": {"0": "gpu-00",
            "1": "gpu-00"}, "versions": {"python": "3.11", "deeptrace": "0.1.0", "platform": "linux"},
            "model_flops_per_token": 1.0e9, "device_peak_flops": 9.89e14, "extras": {}}  # fmt: skip
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    layout.meta_path(RUN_DIR).write_bytes(orjson.dumps(meta))
    # The first attempt logged steps 1-85 and died; the second resumed from step 80's checkpoint 12 s later and
    # logged 81-120 again. Step 37's update was skipped (a non-finite loss); every 20 steps an evaluation.
    metrics = [
        {"step": s, "time_unix_s": start + 2.0 * s - (20.0 if attempt == 1 else 0.0),
         "loss": None if s == 37 else 2.0 + 9.0 / (1 + 0.05 * s) + 0.15 * ((s * 7) % 5) / 5,
         "tokens_per_s": 50_000.0 + 4_000.0 * ((s * 13) % 7) / 7 + (0 if s > 5 else -30_000.0),
         "grad_norm": None if s == 37 else 0.4 + 3.0 / (1 + 0.2 * s), "lr": 3e-4 * min(1.0, s / 10),
         "max_steps": 1000, "skipped": s == 37, "skipped_steps": 1 if s >= 37 else 0, "mfu": 0.412,
         **({"eval_loss": 2.3 + 9.0 / (1 + 0.05 * s), "eval_ppl": math.exp(2.3 + 9.0 / (1 + 0.05 * s))}
            if s % 20 == 0 else {}),
         **({"resumed_from_step": 80, "resumed_from": str(RUN_DIR / "checkpoints" / "step-80"),
             "resumed_from_world_size": 2} if (attempt, s) == (2, 81) else {})}
        for attempt, steps_logged in ((1, range(1, 86)), (2, range(81, steps + 1)))
        for s in steps_logged
    ]  # fmt: skip
    _jsonl(layout.metrics_path(RUN_DIR), [{k: v for k, v in m.items() if v is not None} for m in metrics])
    for rank, (allocated, peak) in enumerate(((52 << 30, 71 << 30), (55 << 30, 76 << 30))):
        records = [{"step": s, "rank": rank, "time_unix_s": start + 2.0 * s, "step_time_s": 2.0,
                    "mem_allocated_bytes": allocated, "mem_peak_bytes": peak} for s in range(1, steps + 1)]  # fmt: skip
        _jsonl(layout.rank_records_path(RUN_DIR, rank), records)
    for rank, last_event_age_s in ((0, 1.0), (1, 95.0)):  # rank 1 has made no progress for 95 s: stale
        beat = {"format_version": 1, "rank": rank, "world_size": 2, "host": "gpu-00", "pid": 4000 + rank,
                "state": "running", "written_wall_s": NOW_S - 0.5, "last_event_wall_s": NOW_S - last_event_age_s,
                "step": steps, "step_done": steps - 1, "open_span": None,
                "collective_entered": {"name": "reduce_scatter", "group": "dp", "seq": 961,
                                       "wall_s": NOW_S - last_event_age_s} if rank == 1 else None,
                "collective_left": None, "groups": {}, "error": None, "phase": None, "thread_id": None,
                "stack_signal": None}  # fmt: skip
        path = layout.heartbeat_path(RUN_DIR, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(beat))
    report = RUN_DIR / layout.REPORT_DIR / "report.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_bytes(orjson.dumps(report_json(hang=True)))
