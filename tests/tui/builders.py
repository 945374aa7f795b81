"""What the xtop tests look at: a real clusterx database (the fake backend plays the cluster) and real run
directories written through deeptrace's writer and collector."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from clusterx import Client
from clusterx.backends.fake import write_fake_state
from clusterx.spec import JobSpec
from deeptrace.collect import Collector
from deeptrace.rundir import RankStepRecord, RunWriter, StepRecord
from xtop.resources import GpuSample, ResourceSample

FIXED_NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def submit_fake(db: str, fake_dir: Path, name: str, run_dir: Path | None = None, **spec: object) -> int:
    client = Client(db)
    try:
        job = client.submit(
            JobSpec(
                name=name, command=["true"], backend="fake", run_dir=str(run_dir) if run_dir else None,
                backend_options={"state_dir": str(fake_dir)}, **spec,  # type: ignore[arg-type]
            )
        )  # fmt: skip
        return int(job.id)
    finally:
        client.close()


def set_fake_state(db: str, fake_dir: Path, job_id: int, state: str) -> None:
    """What the cluster says about the job now (the client records it at its next poll)."""
    client = Client(db)
    try:
        backend_id = client.describe(job_id, poll=False).backend_job_id
        write_fake_state(fake_dir, backend_id, {"state": state, "raw_state": f"FAKE_{state}"})
    finally:
        client.close()


def write_run(run_dir: Path, steps: int, world_size: int = 2, max_steps: int = 40) -> RunWriter:
    """A run directory of `steps` steps: meta, metrics (loss 6/step), per-rank records, heartbeats."""
    writer = RunWriter(run_dir, rank=0, world_size=world_size)
    writer.write_meta(rank_hosts=dict.fromkeys(map(str, range(world_size)), "node-a"), versions={},
                      model_flops_per_token=None, device_peak_flops=None)  # fmt: skip
    for step in range(1, steps + 1):
        append_step(writer, step, max_steps)
    for rank in range(world_size):
        collector = Collector(run_dir, rank=rank, world_size=world_size, heartbeat_interval_s=None, stack_signal=None)
        collector.step_begin(steps)
        collector.step_end(steps)
        collector.close()
    return writer


def append_step(writer: RunWriter, step: int, max_steps: int = 40) -> None:
    writer.append_step(StepRecord(
        step=step, loss=6.0 / step, tokens_per_s=1000.0 + 10 * step, grad_norm=1.0 / step, lr=1e-3,
        max_steps=max_steps, skipped_steps=0, mfu=0.25,
    ))  # fmt: skip
    writer.append_rank_step(RankStepRecord(
        step=step, rank=writer.rank, step_time_s=0.5, mem_allocated_bytes=(1 + step % 3) << 30,
        mem_peak_bytes=3 << 30,
    ))  # fmt: skip


def fixed_resources() -> ResourceSample:
    """A sample that does not move, for snapshots: one GPU with every gauge."""
    gpu = GpuSample(0, "NVIDIA H100 80GB HBM3", 87.0, 61 << 30, 80 << 30, 612.0, 71.0)
    return ResourceSample(42.5, 8, 12 << 30, 64 << 30, (gpu,), "", (40.0, 45.0, 50.0, 35.0, 42.0, 44.0, 41.0, 43.0))


def no_gpu_resources() -> ResourceSample:
    return ResourceSample(12.5, 2, 3 << 30, 24 << 30, (), "no NVIDIA driver (NVML Shared Library Not Found)",
                          (10.0, 15.0))  # fmt: skip
