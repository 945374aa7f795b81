"""Expert parallelism: communication left exposed by one MoE layer, plain EP against Domino-EP, in the same run.

One MoE layer (Qwen3-MoE-shaped: softmax top-k router, SwiGLU experts; default hidden 1024, 16 experts of hidden
512, top-2, 4096 tokens per rank) over N processes (gloo on the CPU, NCCL on CUDA with one GPU per process), its
experts split over all of them (ep_size = N), forward and backward per step. The two schedules take turns, step by
step (plain, Domino, plain, ...), so that both see the same machine.

What is recorded, as deeptrace spans in one run directory per schedule (``<out>/plain``, ``<out>/domino``), so that
``deeptrace analyze`` on either reports the same overlap:

- COMM: every all-to-all from its launch to its completion (told by the collective's future, from gloo's or NCCL's
  own thread), on a track of its own (exchanges of different slices overlap one another);
- COMPUTE: the training thread's time inside the step except where it waits for an exchange (the waits are what
  communication costs the step; on CUDA the waits are stream waits and the compute spans are host-side times).

Exposed communication is deeptrace's: communication time during which no compute runs. Figures per schedule:
exposed communication as a fraction of step time, and the step time; the JSON line ends it:
{"exposed_comm_ratio_domino": .., "exposed_comm_ratio_plain": .., "step_time_ratio": <Domino / plain>, ...}.
Targets: exposed_comm_ratio_domino < exposed_comm_ratio_plain, step_time_ratio < 1. The spread: the same figures
of each timed step on its own, min and max (``*_min_max``).

Usage: python tools/bench/ep_overlap.py [--procs 2] [--slices 2] [--steps 6] [--tokens 4096] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--slices", type=int, default=2, help="Domino slices")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per schedule (after one warm-up each)")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per rank")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--expert-hidden", type=int, default=512)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process on the CPU")
    parser.add_argument("--out", type=Path, default=None, help="run directories (default: a temporary folder)")
    return parser.parse_args()


class Recorder:
    """The CommObserver of the schedule: keeps comm intervals (from communication threads) and waits."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.comms: list[tuple[str, int, int, int]] = []
        self.waits: list[tuple[int, int]] = []
        self.active = False

    def exchanged(self, name: str, launch_ns: int, done_ns: int, nbytes: int) -> None:
        with self.lock:
            if self.active:
                self.comms.append((name, launch_ns, done_ns, nbytes))

    def waited(self, name: str, start_ns: int, end_ns: int) -> None:
        if self.active:
            self.waits.append((start_ns, end_ns))


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(args.threads)
    from deeptrace.collect import Collector
    from deeptrace.spans import Category
    from torch import nn
    from xtrain.config import ParallelSection
    from xtrain.model.moe import MoEBlock, MoEConfig
    from xtrain.parallel.distributed import close_distributed, init_distributed
    from xtrain.parallel.expert_parallel import apply_expert_parallel
    from xtrain.parallel.layout import check_layout
    from xtrain.parallel.mesh import model_meshes

    where = init_distributed(None)
    dtype = torch.bfloat16 if where.device.type == "cuda" else torch.float32
    config = MoEConfig(
        num_experts=args.experts, num_experts_per_tok=args.top_k, moe_intermediate_size=args.expert_hidden
    )
    layout = check_layout(ParallelSection(ep_size=world), world, world, args.experts)
    mesh = model_meshes(layout, where.device.type).expert
    assert mesh is not None, "expert parallelism needs --procs 2 or more"
    recorders = {"plain": Recorder(), "domino": Recorder()}
    layers: dict[str, nn.Module] = {}
    for name, slices in (("plain", 1), ("domino", args.slices)):
        torch.manual_seed(0)  # the same weights on every rank before each keeps its experts
        holder = nn.ModuleDict({"moe": MoEBlock(args.hidden, config)})
        holder["moe"].init_weights(torch.Generator().manual_seed(0))
        holder.to(device=where.device, dtype=dtype)
        apply_expert_parallel(holder, mesh, domino_slices=slices, observer=recorders[name])
        layers[name] = holder["moe"]
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(args.tokens, args.hidden, generator=generator).to(where.device, dtype).requires_grad_(True)
    collectors = {
        name: Collector(Path(out) / name, rank, world, heartbeat_interval_s=None, stack_signal=None) for name in layers
    }
    step_s: dict[str, list[float]] = {name: [] for name in layers}
    for step in range(args.steps + 1):
        for name, layer in layers.items():
            recorder, collector = recorders[name], collectors[name]
            recorder.comms.clear()
            recorder.waits.clear()
            recorder.active = step > 0
            torch.distributed.barrier()
            if where.device.type == "cuda":
                torch.cuda.synchronize()
            collector.step_begin(step)
            start = time.monotonic_ns()
            y, _ = layer(x)
            y.float().square().mean().backward()
            if where.device.type == "cuda":
                torch.cuda.synchronize()
            end = time.monotonic_ns()
            collector.step_end(step)
            recorder.active = False
            if step == 0:
                continue
            time.sleep(0.05)  # the last completion callbacks
            step_s[name].append((end - start) / 1e9)
            cursor = start
            for wait_start, wait_end in sorted(recorder.waits):
                if wait_start > cursor:
                    collector.record("compute", Category.COMPUTE, cursor, wait_start, step=step, track="main")
                cursor = max(cursor, wait_end)
            if end > cursor:
                collector.record("compute", Category.COMPUTE, cursor, end, step=step, track="main")
            lanes: dict[str, int] = {}
            for comm_name, launch_ns, done_ns, nbytes in sorted(recorder.comms, key=lambda item: item[1]):
                # One track per exchange name (slice, direction): spans on a track never overlap.
                lane = lanes.setdefault(comm_name.split(" backward")[0], len(lanes))
                collector.record(
                    comm_name, Category.COMM, launch_ns, done_ns, step=step, nbytes=nbytes, group="ep",
                    track=f"ep-comm/{lane}",
                )  # fmt: skip
    for collector in collectors.values():
        collector.close()
    Path(out, f"steps-rank-{rank}.json").write_text(json.dumps(step_s))
    close_distributed()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def main() -> None:
    args = parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="ep-overlap-"))
    out.mkdir(parents=True, exist_ok=True)
    mp.start_processes(_rank, args=(args.procs, _free_port(), args, str(out)), nprocs=args.procs, start_method="spawn")
    step_s: dict[str, list[float]] = {"plain": [], "domino": []}
    per_rank: dict[str, list[list[float]]] = {"plain": [], "domino": []}
    for rank in range(args.procs):
        for name, values in json.loads(Path(out, f"steps-rank-{rank}.json").read_text()).items():
            step_s[name].append(sum(values) / len(values))
            per_rank[name].append(values)
    figures = {name: exposed_figures(out / name) for name in ("plain", "domino")}
    plain_step, domino_step = max(step_s["plain"]), max(step_s["domino"])
    # The spread: each timed step's own figures (step time: the slowest rank's), min and max.
    per_step = {name: [max(steps) for steps in zip(*per_rank[name], strict=True)] for name in per_rank}
    step_ratios = [domino / plain for domino, plain in zip(per_step["domino"], per_step["plain"], strict=True)]

    def spread(values: list[float]) -> list[float]:
        return [round(min(values), 4), round(max(values), 4)] if values else []

    result = {
        "exposed_comm_ratio_domino": round(figures["domino"]["exposed_comm_ms"] / figures["domino"]["window_ms"], 4),
        "exposed_comm_ratio_plain": round(figures["plain"]["exposed_comm_ms"] / figures["plain"]["window_ms"], 4),
        "step_time_ratio": round(domino_step / plain_step, 4),
        "exposed_comm_ratio_domino_min_max": spread(figures["domino"]["step_ratios"]),
        "exposed_comm_ratio_plain_min_max": spread(figures["plain"]["step_ratios"]),
        "step_time_ratio_min_max": spread(step_ratios),
        "step_s_plain": round(plain_step, 4),
        "step_s_domino": round(domino_step, 4),
        "comm_ms_plain": round(figures["plain"]["comm_ms"], 2),
        "comm_ms_domino": round(figures["domino"]["comm_ms"], 2),
        "exposed_comm_ms_plain": round(figures["plain"]["exposed_comm_ms"], 2),
        "exposed_comm_ms_domino": round(figures["domino"]["exposed_comm_ms"], 2),
        "compute_ms_plain": round(figures["plain"]["compute_ms"], 2),
        "compute_ms_domino": round(figures["domino"]["compute_ms"], 2),
        "procs": args.procs,
        "slices": args.slices,
        "tokens_per_rank": args.tokens,
        "hidden": args.hidden,
        "experts": args.experts,
        "expert_hidden": args.expert_hidden,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "backend": "nccl" if torch.cuda.is_available() else "gloo",
        "run_dirs": str(out),
        "torch": torch.__version__,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }
    print(json.dumps(result))


def exposed_figures(run_dir: Path) -> dict[str, Any]:
    """deeptrace's per-step breakdown of one run directory (``analyse_run``, what ``deeptrace analyze`` reports),
    summed over the timed steps (those with communication) and averaged over ranks; ``step_ratios``: each timed
    step's own exposed share (exposed communication / window), for the spread."""
    from deeptrace.analysis.run import analyse_run

    analysis = analyse_run(run_dir, jobs=1, clock_sync=False)
    keys = ("window_ms", "comm_ms", "exposed_comm_ms", "compute_ms")
    totals = dict.fromkeys(keys, 0.0)
    per_step: dict[int, dict[str, float]] = {}
    for result in analysis.ranks.values():
        for step in result.breakdown.steps:
            if step.comm_ms > 0:
                one = per_step.setdefault(step.step, dict.fromkeys(keys, 0.0))
                for key in keys:
                    totals[key] += getattr(step, key) / len(analysis.ranks)
                    one[key] += getattr(step, key) / len(analysis.ranks)
    ratios = [one["exposed_comm_ms"] / one["window_ms"] for one in per_step.values() if one["window_ms"] > 0]
    return {**totals, "step_ratios": ratios}


if __name__ == "__main__":
    sys.exit(main())
