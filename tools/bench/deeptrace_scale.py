"""Scale of `deeptrace analyze` against HTA's overlap analysis on the same large Kineto traces, side by side.

Generates `--ranks` Kineto traces of about `--mb-per-rank` MB each (uncompressed JSON, written event by event into
a temporary folder that is deleted afterwards), shaped like real PyTorch profiler output: ProfilerStep spans,
nested CPU operators, cudaLaunchKernel calls linked by correlation ids to compute kernels, memory copies, and NCCL
kernels carrying the NCCL metadata (process group, collective name, sizes) on their own stream. Then, each in a
fresh subprocess, it runs

  deeptrace: `deeptrace analyze DIR --json --no-png --output OUT`
  HTA:       `TraceAnalysis(trace_dir=DIR).get_comm_comp_overlap(visualize=False)`

and measures wall time, CPU time and peak RSS of the whole process tree (the process and every child, summed, polled
every 100 ms with psutil). The per-rank overlap of both is compared too.

`--rounds` rounds (default 2), each running deeptrace then HTA: the figures are the medians, the spread each
round's own speedup (`speedup_vs_hta_min_max`) and deeptrace's wall times' min and max.

Last line, JSON: {"speedup_vs_hta": .., "rss_ratio_vs_hta": .., ...}. Targets: speedup >= 5, RSS ratio <= 0.25.

Usage: python tools/bench/deeptrace_scale.py [--ranks 8] [--mb-per-rank 200] [--skip-hta] [--rounds 2]
Memory: HTA holds whole traces in memory (several GB per 200 MB trace); try small sizes first and watch `free -g`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

BASE_US = 1_700_000_000_000_000  # Kineto's microsecond timestamps (Unix time here)
STEP_US = 200_000
GEMMS = [
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
    "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
    "triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0",
]
OPS = ["aten::mm", "aten::add", "aten::_softmax", "aten::mul", "aten::to", "aten::copy_", "aten::linear"]
NCCL = [
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "allgather"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "reduce_scatter"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "allreduce"),
]


def _x(cat: str, name: str, pid: int, tid: int, ts: int, dur: int, args: dict[str, Any]) -> dict[str, Any]:  # noqa: PLR0917  # the Chrome event fields, in order
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


class _Writer:
    def __init__(self, out: Any) -> None:
        self.out = out
        self.first = True
        self.bytes = 0
        self.events = 0

    def __call__(self, event: dict[str, Any]) -> None:
        text = json.dumps(event, separators=(", ", ": "))
        self.out.write(("  " if self.first else ",\n  ") + text)
        self.first = False
        self.bytes += len(text) + 4
        self.events += 1


KERNEL_ARGS = {"queued": 0, "device": 0, "context": 1, "stream": 7, "registers per thread": 128,
               "shared memory": 49152, "blocks per SM": 1.9, "warps per SM": 7.6, "grid": [264, 1, 1],
               "block": [384, 1, 1], "est. achieved occupancy %": 12}  # fmt: skip
OP_ARGS = {"Input Dims": [[4096, 4096], [4096]], "Input type": ["c10::BFloat16", ""], "Fwd thread id": 0}
PY_FUNCTION = "torch/nn/modules/module.py(1520): _call_impl"


def write_rank(path: Path, rank: int, world: int, target_bytes: int) -> int:
    """One rank's trace; returns the number of events."""
    rng = random.Random(rank)
    corr = 6_000_000 + rank  # real correlation ids are large (and HTA 0.5 with pandas 3 fails on int16-sized ones)
    with path.open("w") as out:
        emit = _Writer(out)
        out.write(
            '{\n  "schemaVersion": 1,\n  "deviceProperties": [{"id": 0, "name": "NVIDIA H100", "numSms": 132}],\n'
        )
        out.write(f'  "distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {world}}},\n')
        out.write('  "traceEvents": [\n')
        step = 0
        while emit.bytes < target_bytes:
            t0 = BASE_US + step * STEP_US + rng.randint(0, 50)
            emit(_x("user_annotation", f"ProfilerStep#{step}", 100, 100, t0, STEP_US - 100, {"External id": corr}))
            cpu, gpu, nccl_free, seq = t0 + 10, t0 + 50, t0, step * 1000
            while cpu < t0 + STEP_US - 2000 and emit.bytes < target_bytes:
                op_dur = rng.randint(8, 40)
                ids = {"External id": corr, "Ev Idx": corr, "Sequence number": corr}
                emit(_x("cpu_op", rng.choice(OPS), 100, 100, cpu, op_dur, {**ids, **OP_ARGS}))
                emit(_x("python_function", PY_FUNCTION, 100, 100, cpu, op_dur + 2, {"Python id": corr}))
                launch = cpu + rng.randint(1, 5)
                emit(_x("cuda_runtime", "cudaLaunchKernel", 100, 100, launch, 4, {"cbid": 211, "correlation": corr}))
                gpu = max(gpu, launch + 5) + rng.randint(0, 20)
                k_dur = rng.randint(5, 400)
                emit(_x("kernel", rng.choice(GEMMS), 0, 7, gpu, k_dur, {**KERNEL_ARGS, "correlation": corr}))
                corr += 1
                gpu += k_dur
                if rng.random() < 0.02:
                    emit(_x("cuda_runtime", "cudaMemcpyAsync", 100, 100, launch + 1, 6, {"correlation": corr}))
                    memcpy_args = {"device": 0, "stream": 7, "correlation": corr, "bytes": 1 << 20}
                    emit(_x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 0, 7, gpu, 12, memcpy_args))
                    corr += 1
                    gpu += 12
                if rng.random() < 0.03:  # a collective on the NCCL stream, overlapping later compute
                    name, coll = rng.choice(NCCL)
                    start = max(nccl_free, gpu - rng.randint(0, 200))
                    dur = rng.randint(100, 3000)
                    emit(_x("cuda_runtime", "cudaLaunchKernelExC", 100, 101, launch + 2, 5, {"correlation": corr}))
                    nccl_args = {"device": 0, "stream": 20, "correlation": corr, "Collective name": coll,
                                 "In msg nelems": 1 << 22, "Out msg nelems": 1 << 22, "Group size": world,
                                 "dtype": "BFloat16", "Process Group Name": "0", "Seq": seq}  # fmt: skip
                    emit(_x("kernel", name, 0, 20, start, dur, nccl_args))
                    corr += 1
                    seq += 1
                    nccl_free = start + dur
                cpu = launch + rng.randint(5, 30)
            step += 1
        out.write('\n  ],\n  "traceName": "bench", "displayTimeUnit": "ms", "baseTimeNanoseconds": 0\n}\n')
    return emit.events


def measure(cmd: list[str], cwd: Path) -> tuple[float, float, int, str]:
    """Wall seconds, CPU seconds (user + system, the whole tree), peak RSS bytes of the process tree, stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ps = psutil.Process(proc.pid)
    peak = 0
    done = threading.Event()

    def poll() -> None:
        nonlocal peak
        while not done.is_set():
            try:
                tree = [ps, *ps.children(recursive=True)]
                total = 0
                for p in tree:
                    with contextlib.suppress(psutil.Error):  # a child that just exited
                        total += p.memory_info().rss
                peak = max(peak, total)
            except psutil.Error:
                pass
            time.sleep(0.1)  # a /proc scan per poll: more often would steal CPU from what is measured

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    out, _ = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    poller.join()
    if proc.returncode not in (0,):
        raise SystemExit(f"{cmd[:3]} failed with exit code {proc.returncode}")
    # Children's CPU time counts once they are waited for: deeptrace and HTA wait for their worker processes.
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, peak, out


HTA_SCRIPT = """
import json, sys
from hta.trace_analysis import TraceAnalysis
df = TraceAnalysis(trace_dir=sys.argv[1]).get_comm_comp_overlap(visualize=False)
print(json.dumps({int(r): float(v) for r, v in zip(df["rank"], df["comp_comm_overlap_pctg"])}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--mb-per-rank", type=float, default=200.0)
    parser.add_argument("--skip-hta", action="store_true", help="only deeptrace (when memory is short)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each running deeptrace then HTA once")
    parser.add_argument("--keep", type=Path, default=None, help="generate into this folder and keep it")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="deeptrace-scale-"))
    traces = args.keep or (work / "traces")
    traces.mkdir(parents=True, exist_ok=True)
    try:
        t = time.perf_counter()
        events = sum(write_rank(traces / f"rank-{r}.json", r, args.ranks, int(args.mb_per_rank * 1e6))
                     for r in range(args.ranks))  # fmt: skip
        size = sum(p.stat().st_size for p in traces.iterdir())
        print(f"generated {args.ranks} traces, {size / 1e6:.0f} MB, {events} events in {time.perf_counter() - t:.0f} s",
              file=sys.stderr)  # fmt: skip
        deeptrace = [str(Path(sys.executable).parent / "deeptrace"), "analyze", str(traces), "--json", "--no-png",
                     "--output", str(work / "out")]  # fmt: skip
        hta = [sys.executable, "-c", HTA_SCRIPT, str(traces)]
        ours_runs, theirs_runs = [], []
        for round_index in range(args.rounds):  # interleaved, so that a shared machine's drift hits both alike
            ours_runs.append(measure(deeptrace, work))
            print(f"round {round_index} deeptrace: {ours_runs[-1][0]:.1f} s, peak RSS {ours_runs[-1][2] / 2**20:.0f} "
                  "MiB", file=sys.stderr)  # fmt: skip
            if not args.skip_hta:
                theirs_runs.append(measure(hta, work))
                print(f"round {round_index} HTA: {theirs_runs[-1][0]:.1f} s, peak RSS "
                      f"{theirs_runs[-1][2] / 2**20:.0f} MiB", file=sys.stderr)  # fmt: skip
        dt_wall, dt_cpu = statistics.median(r[0] for r in ours_runs), statistics.median(r[1] for r in ours_runs)
        dt_rss = max(r[2] for r in ours_runs)
        ours = {int(r): v["overlap_pct"] for r, v in json.loads(ours_runs[-1][3])["ranks"].items()}
        result: dict[str, Any] = {
            "ranks": args.ranks,
            "mb_per_rank": round(size / 1e6 / args.ranks, 1),
            "events_per_rank": events // args.ranks,
            "deeptrace_wall_s": round(dt_wall, 2),
            "deeptrace_wall_s_min_max": [
                round(min(r[0] for r in ours_runs), 2),
                round(max(r[0] for r in ours_runs), 2),
            ],
            "deeptrace_cpu_s": round(dt_cpu, 2),
            "deeptrace_peak_rss_mib": round(dt_rss / 2**20),
            "rounds": args.rounds,
            "cpus": os.cpu_count(),
            "machine": platform.node(),
            "date": time.strftime("%Y-%m-%d"),
        }
        if theirs_runs:
            hta_wall = statistics.median(r[0] for r in theirs_runs)
            hta_cpu = statistics.median(r[1] for r in theirs_runs)
            hta_rss = max(r[2] for r in theirs_runs)
            theirs = {int(r): v for r, v in json.loads(theirs_runs[-1][3].strip().splitlines()[-1]).items()}
            speedups = [h[0] / d[0] for h, d in zip(theirs_runs, ours_runs, strict=True)]
            result |= {
                "hta_wall_s": round(hta_wall, 2),
                "hta_cpu_s": round(hta_cpu, 2),
                "cpu_time_ratio_hta_over_deeptrace": round(hta_cpu / dt_cpu, 2),
                "hta_peak_rss_mib": round(hta_rss / 2**20),
                "max_overlap_diff_pct": round(max(abs(ours[r] - theirs[r]) for r in theirs), 3),
                "speedup_vs_hta": round(hta_wall / dt_wall, 2),
                "speedup_vs_hta_min_max": [round(min(speedups), 2), round(max(speedups), 2)],
                "rss_ratio_vs_hta": round(dt_rss / hta_rss, 3),
            }
        print(json.dumps(result))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
