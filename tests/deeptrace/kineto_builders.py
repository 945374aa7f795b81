"""Builders of synthetic PyTorch-profiler (Kineto) traces and collector run directories with known answers.

Kineto traces are written the way Kineto writes them (metadata keys around `traceEvents`, complete "X" events,
kernels linked to their CPU launch by `args.correlation`), with times in microseconds chosen by the test, so
every expected figure (overlap, breakdown, skew, offsets) is known exactly from the plan.
"""

from __future__ import annotations

import gzip
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deeptrace.collect import Collector
from deeptrace.rundir import layout
from deeptrace.spans import Category

NCCL_ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"


@dataclass
class KinetoTrace:
    """One rank's Kineto trace under construction. Times in microseconds."""

    rank: int | None = 0
    world_size: int = 1
    events: list[dict[str, Any]] = field(default_factory=list)
    markers: bool = True
    _corr: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))

    def step(self, number: int, start_us: float, dur_us: float) -> None:
        self.events.append(
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "pid": 1, "tid": 1,
             "ts": start_us, "dur": dur_us, "args": {}}
        )  # fmt: skip

    def kernel(
        self,
        name: str,
        start_us: float,
        dur_us: float,
        *,
        launch_us: float | None = None,
        stream: int = 7,
        cat: str = "kernel",
        args: dict[str, Any] | None = None,
    ) -> None:
        """A GPU event, launched by a cudaLaunchKernel at `launch_us` (default: when it starts)."""
        corr = next(self._corr)
        launch = start_us if launch_us is None else launch_us
        self.events.append(
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": launch,
             "dur": 0.5, "args": {"correlation": corr}}
        )  # fmt: skip
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": start_us, "dur": dur_us,
             "args": {"device": 0, "stream": stream, "correlation": corr, **(args or {})}}
        )  # fmt: skip

    def cpu(self, name: str, start_us: float, dur_us: float, *, tid: int = 1, cat: str = "cpu_op") -> None:
        """A CPU event of the training thread (tid 1, the ProfilerStep thread) or, with `tid`, of another thread."""
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": start_us,
                            "dur": dur_us, "args": {}})  # fmt: skip

    def gloo(self, name: str, start_us: float, dur_us: float, *, tid: int = 9) -> None:
        """A collective as gloo records it: a `gloo:<name>` annotation on its worker thread (tid 9)."""
        self.cpu(f"gloo:{name}", start_us, dur_us, tid=tid, cat="user_annotation")

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        if self.markers:
            doc["schemaVersion"] = 1
            info: dict[str, Any] = {"backend": "nccl", "world_size": self.world_size}
            if self.rank is not None:
                info["rank"] = self.rank
            doc["distributedInfo"] = info
        doc["traceEvents"] = self.events
        doc["displayTimeUnit"] = "ms"
        return doc

    def write(self, path: Path) -> Path:
        data = json.dumps(self.document(), indent=1).encode()
        if path.name.endswith(".gz"):
            data = gzip.compress(data)
        path.write_bytes(data)
        return path


def known_overlap_trace(rank: int = 0) -> KinetoTrace:
    """Two steps (plus a third, cut short, as the profiler leaves it) with known figures per step:

    step window 0..200 us: comm 20..120 (100 us) on stream 20; compute 0..50, 100..160 and 190..200 on stream 7;
    a memcpy 170..180. So comm∩compute = 30+20 = 50 us → overlap 50%; exposed comm 50 us; compute 120 us;
    memory-only 10 us; idle = 200 - (120 + 50 + 10) = 20 us.
    """
    t = KinetoTrace(rank=rank, world_size=1)
    for i in range(3):
        base = 1_000_000 + i * 1000
        t.step(10 + i, base, 900 if i < 2 else 100)
        t.kernel(GEMM, base + 0, 50)
        t.kernel(NCCL_ALLREDUCE, base + 20, 100, stream=20)
        t.kernel(GEMM, base + 100, 60)
        t.kernel("Memcpy DtoH (Device -> Pinned)", base + 170, 10, cat="gpu_memcpy")
        t.kernel(GEMM, base + 190, 10)
    return t


def allreduce_ranks(
    world_size: int,
    *,
    steps: int = 3,
    per_step: int = 4,
    slow_rank: int | None = None,
    late_us: float = 5000.0,
    clock_skew_us: dict[int, float] | None = None,
    with_seq: bool = True,
) -> list[KinetoTrace]:
    """`world_size` ranks doing compute then an all-reduce, `per_step` times per step.

    Every rank computes 1000 us before each all-reduce; `slow_rank` computes `late_us` longer, so it arrives
    that much later and the others wait inside their all-reduce. Every all-reduce ends at the same true time on
    all ranks. `clock_skew_us[r]` shifts all of rank r's timestamps (its host clock is off by that much).
    """
    skew = clock_skew_us or {}
    traces = []
    for rank in range(world_size):
        t = KinetoTrace(rank=rank, world_size=world_size)
        shift = skew.get(rank, 0.0)
        seq = 0
        for s in range(steps + 1):  # the last step is cut short by the profiler, as in real traces
            step_start = 10_000_000 + s * 100_000
            t.step(s, step_start + shift, 90_000 if s < steps else 10)
            for k in range(per_step):
                begin = step_start + 100 + k * 20_000
                compute = 1000 + (late_us if rank == slow_rank else 0.0)
                arrive = begin + compute
                end = begin + 1000 + late_us + 2000  # the same for all: the slow rank's arrival + 2 ms transfer
                if s == steps:
                    break
                t.kernel(GEMM, begin + shift, compute, launch_us=step_start + 50 + k + shift)
                args = {"Process Group Name": "0", "Collective name": "allreduce", "Group size": world_size}
                if with_seq:
                    args["Seq"] = seq
                t.kernel(NCCL_ALLREDUCE, arrive + shift, end - arrive, stream=20, launch_us=step_start + 60 + k + shift,
                         args=args)  # fmt: skip
                seq += 1
        traces.append(t)
    return traces


def write_ranks(traces: list[KinetoTrace], folder: Path, suffix: str = ".json") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [t.write(folder / f"rank-{t.rank}{suffix}") for t in traces]


def collector_run(
    run_dir: Path,
    world_size: int,
    *,
    steps: int = 3,
    slow_rank: int | None = None,
    late_ms: float = 5.0,
    clock_skew_ms: dict[int, float] | None = None,
) -> Path:
    """A run directory written by the real Collector, with planted times (`Collector.record`).

    Per step and rank: forward compute (10 ms, +late_ms on `slow_rank`), then an all_reduce of group "dp" that
    ends at the same true time on every rank. The clock references are then set so that every rank's monotonic
    clock maps to the same wall time, except ranks in `clock_skew_ms`, whose host clock is off by that much.
    """
    skew = clock_skew_ms or {}
    ms = 1_000_000
    for rank in range(world_size):
        with Collector(run_dir, rank, world_size, heartbeat_interval_s=None) as collector:
            for step in range(steps):
                t0 = 10_000 * ms + step * 100 * ms
                compute_end = t0 + 10 * ms + (round(late_ms * ms) if rank == slow_rank else 0)
                end = t0 + 10 * ms + round(late_ms * ms) + 2 * ms
                collector.record("forward", Category.COMPUTE, t0, compute_end, step=step, track="main")
                collector.record("all_reduce", Category.COMM, compute_end, end, step=step, group="dp", seq=step,
                                 track="comm")  # fmt: skip
        clock_file = layout.clock_path(run_dir, rank)
        clock = json.loads(clock_file.read_text())
        planted = {
            "wall_ns": 1_700_000_000 * 10**9 + round(skew.get(rank, 0.0) * ms),
            "mono_ns": 0,
            "uncertainty_ns": 0,
        }
        clock["start"] = planted
        if clock.get("end") is not None:
            clock["end"] = planted
        clock_file.write_text(json.dumps(clock))
    return run_dir
