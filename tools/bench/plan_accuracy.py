"""xtrain plan against measurement: the planned per-rank tensor peak and bytes per collective kind beside what
``trace.memory`` records in real runs of xtrain's own trainer (gloo processes on this machine, fp32).

For every configuration of the grid (the CPU-sized ``debug`` MoE and the larger ``cpu-moe``; 1, 2 and 4
processes; checkpointing none, full and full + offload; ep_size 1 and 2; replicate 1 and 2; packs of 512 to 8192
tokens; one or two micro-batches per rank) it trains ``--steps`` optimizer steps with ``trace.memory = true``
and compares, per rank:

- memory: the plan's ``tensor_peak_bytes`` (``xtrain.plan.planner.plan_for`` on the ``cpu`` device: no allocator
  headroom, since the CPU figure is exact tensor bytes) with the largest ``mem_tensor_peak_bytes`` of the steps
  after the first. Under expert parallelism the rows a rank's experts receive depend on the routing, so each
  step is planned with the rows recorded for it (``expert_rows``) and the rank's plan is the largest of its
  steps; the error against the uniform-routing plan (what ``xtrain plan`` says before a run) is reported as
  ``memory_error_uniform_routing`` and not scored. The plan describes a steady-state step: one that starts with
  the AdamW moments allocated. The first step has none before its update (they are created inside it, after the
  backward), so its peak is lower and is not what the plan predicts; it is reported (``first_step_peak``) but not
  scored. The relative error of a configuration is the worst over its ranks: |planned - measured| / measured.
- communication: for every rank and every step (the first included: the bytes do not depend on the state), the
  planned bytes per kind and link (``xtrain.plan.comm.comm_bytes_per_step`` for that rank, what ``plan_for``
  reports for rank 0) with the measured ``comm_bytes``. All-gather, reduce-scatter and all-reduce are
  deterministic: their worst relative error is ``max_comm_error``. The all-to-all of expert parallelism depends
  on the routing (how many of a rank's token-expert pairs go to experts on another rank): the plan gives its
  expectation under uniform routing, so its error is reported apart, as ``max_all_to_all_error``, and is not
  part of ``max_comm_error``.

Targets (issue 21): ``max_memory_error`` <= 0.05 and ``max_comm_error`` <= 0.001.

The ranks of one (processes, processes per node) group are started once and train its configurations in turn
(one process group, torch imported once). Runs with 4 processes put 2 on each of two "nodes" (LOCAL_WORLD_SIZE=2),
so HSDP's all-reduce and the experts' groups cross nodes as on a cluster. Run directories go to a temporary
folder, deleted unless ``--out`` is given.

Prints a table, then one JSON line: {"max_memory_error", "max_comm_error", "max_all_to_all_error", "rows": [...],
"total_s", ...}.

Usage: python tools/bench/plan_accuracy.py [--steps 6] [--only NAME,...] [--out DIR]
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from deeptrace.rundir import RankStepRecord, read_rank_records
from xtrain.config import TrainConfig
from xtrain.parallel.distributed import _free_port, close_distributed, init_distributed
from xtrain.plan.comm import KINDS, comm_bytes_per_step
from xtrain.plan.devices import device
from xtrain.plan.planner import plan_for
from xtrain.train.build import resolve_model_config
from xtrain.train.launch import check_world_size, load_and_check
from xtrain.train.trainer import _train

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "debug_moe.toml"
EXACT_KINDS = ("all_gather", "reduce_scatter", "all_reduce")


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    procs: int
    per_node: int
    pack: int
    micro: int = 1
    """Packs per rank per step (micro-batches)."""
    checkpointing: str = "none"
    offload: bool = False
    ep: int = 1
    replicate: int = 1

    def overrides(self, steps: int, cache_dir: Path) -> tuple[str, ...]:
        return (
            f'model.size="{self.model}"',
            f"data.pack_tokens={self.pack}",
            f"data.cache_dir={cache_dir}",
            f"train.global_batch={self.procs * self.micro}",
            f"train.max_steps={steps}",
            'parallel.mixed_precision="fp32"',
            f"parallel.ep_size={self.ep}",
            f"parallel.replicate={self.replicate}",
            f'memory.checkpointing="{self.checkpointing}"',
            f"memory.offload={'true' if self.offload else 'false'}",
            "trace.enabled=false",
            "trace.profile_steps=[]",
            "trace.memory=true",
            "checkpoint.every_steps=0",
        )


GRID = (
    Case("debug-1p-none-512", "debug", 1, 1, 512),
    Case("debug-1p-full-4096", "debug", 1, 1, 4096, checkpointing="full"),
    Case("cpu-moe-1p-none-1024", "cpu-moe", 1, 1, 1024),
    Case("debug-2p-none-512-2micro", "debug", 2, 2, 512, micro=2),
    Case("debug-2p-none-4096", "debug", 2, 2, 4096),
    Case("debug-2p-full-2048", "debug", 2, 2, 2048, checkpointing="full"),
    Case("debug-2p-offload-8192", "debug", 2, 2, 8192, checkpointing="full", offload=True),
    Case("debug-2p-ep2-1024", "debug", 2, 2, 1024, ep=2),
    Case("cpu-moe-2p-none-512", "cpu-moe", 2, 2, 512),
    Case("cpu-moe-2p-full-2048", "cpu-moe", 2, 2, 2048, checkpointing="full"),
    Case("cpu-moe-2p-offload-4096", "cpu-moe", 2, 2, 4096, checkpointing="full", offload=True),
    Case("cpu-moe-2p-ep2-full-1024", "cpu-moe", 2, 2, 1024, checkpointing="full", ep=2),
    Case("debug-4p-rep2-1024", "debug", 4, 2, 1024, replicate=2),
    Case("debug-4p-ep2-rep2-512", "debug", 4, 2, 512, ep=2, replicate=2),
    Case("cpu-moe-4p-rep2-full-2048", "cpu-moe", 4, 2, 2048, checkpointing="full", replicate=2),
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per configuration (at least 2)")
    parser.add_argument("--only", default="", help="comma-separated configuration names (default: the grid)")
    parser.add_argument("--out", type=Path, default=None, help="keep the run directories here")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2: the first step is not a steady-state step")
    return args


def selected(only: str) -> list[Case]:
    if not only:
        return list(GRID)
    names = only.split(",")
    unknown = sorted(set(names) - {case.name for case in GRID})
    if unknown:
        raise SystemExit(f"unknown configuration(s): {', '.join(unknown)}")
    return [case for case in GRID if case.name in names]


def rank_main(  # noqa: PLR0917 (torch.multiprocessing passes these positionally)
    rank: int, world: int, per_node: int, port: int, cases: list[Case], steps: int, out: str
) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % per_node),
                      LOCAL_WORLD_SIZE=str(per_node), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    torch.set_num_threads(1)  # 2 cores for up to 4 ranks: one thread each, as xtrain's launcher sets it
    dist_ctx = init_distributed("cpu")
    try:
        for case in cases:
            config = load_and_check(CONFIG, case.overrides(steps, Path(out) / "cache"))
            named = {"config_name": case.name} if "config_name" in inspect.signature(_train).parameters else {}
            _train(config, Path(out) / case.name, dist_ctx, "none", **named)
            gc.collect()  # the next configuration's start level counts reachable tensors only
    finally:
        close_distributed()


def measured_config(case: Case, steps: int, out: Path) -> TrainConfig:
    return load_and_check(CONFIG, case.overrides(steps, out / "cache"))


def compare(case: Case, steps: int, out: Path) -> dict[str, Any]:
    """The plan of ``case`` beside its run's records."""
    config = measured_config(case, steps, out)
    model = resolve_model_config(config)
    layout = check_world_size(config, case.procs, case.per_node)
    cpu = device("cpu")
    plan = plan_for(config, model, layout, cpu)
    records = read_rank_records(out / case.name)
    memory_errors, uniform_errors, first, steady, planned_peaks = [], [], [], [], []
    comm_error, a2a_error = 0.0, 0.0
    for rank, steps_of_rank in sorted(records.items()):
        scored = [r for r in steps_of_rank if r.step > 1 and r.mem_tensor_peak_bytes is not None]
        if not scored:
            raise SystemExit(f"{case.name}: rank {rank} recorded no tensor peak after step 1")
        measured = max(r.mem_tensor_peak_bytes or 0 for r in scored)
        # Under expert parallelism each step is planned with the rows this rank's experts received in it (the
        # routing, recorded by trace.memory); otherwise every step has the same plan.
        planned = max((plan_for(config, model, layout, cpu, expert_rows=r.expert_rows) if r.expert_rows else plan)
                      .tensor_peak_bytes for r in scored)  # fmt: skip
        steady.append(measured)
        planned_peaks.append(planned)
        first.append(next(r.mem_tensor_peak_bytes for r in steps_of_rank if r.step == 1))
        memory_errors.append(_relative(planned, measured))
        uniform_errors.append(_relative(plan.tensor_peak_bytes, measured))
        planned_comm = comm_bytes_per_step(config, model, layout, rank=rank, device_type="cpu")
        for record in steps_of_rank:
            comm_error = max(comm_error, _comm_error(planned_comm, record, EXACT_KINDS))
            a2a_error = max(a2a_error, _comm_error(planned_comm, record, ("all_to_all",)))
    sent = records[0][-1].comm_bytes or {}
    return {
        "name": case.name,
        "model": case.model,
        "procs": case.procs,
        "per_node": case.per_node,
        "pack_tokens": case.pack,
        "micro_batches": case.micro,
        "checkpointing": case.checkpointing,
        "offload": case.offload,
        "ep_size": case.ep,
        "replicate": case.replicate,
        "planned_peak": planned_peaks,
        "planned_peak_uniform_routing": plan.tensor_peak_bytes,
        "planned_parts": {k: v for k, v in plan.parts.items() if k != "headroom"},
        "measured_peak": steady,
        "first_step_peak": first,
        "memory_error": round(max(memory_errors), 4),
        "memory_error_uniform_routing": round(max(uniform_errors), 4) if case.ep > 1 else None,
        "comm_error": round(comm_error, 6),
        "all_to_all_error": round(a2a_error, 4) if case.ep > 1 else None,
        "planned_comm": plan.comm_bytes,
        "measured_comm_rank0": {kind: {"intra": sent[kind].intra, "inter": sent[kind].inter} for kind in sent},
    }


def _comm_error(planned: dict[str, Any], record: RankStepRecord, kinds: tuple[str, ...]) -> float:
    assert record.comm_bytes is not None and set(record.comm_bytes) == set(KINDS)
    worst = 0.0
    for kind in kinds:
        measured = record.comm_bytes[kind]
        for plan_bytes, got in ((planned[kind].intra, measured.intra), (planned[kind].inter, measured.inter)):
            worst = max(worst, _relative(plan_bytes, got) if got else float(plan_bytes != 0))
    return worst


def _relative(planned: int, measured: int) -> float:
    return abs(planned - measured) / max(measured, 1)


def table(rows: list[dict[str, Any]]) -> str:
    mib = 1 << 20
    lines = [f"{'configuration':<28} {'planned MiB':>11} {'measured MiB':>13} {'mem err':>8} {'comm err':>9} "
             f"{'a2a err':>8}"]  # fmt: skip
    for row in rows:
        a2a = "-" if row["all_to_all_error"] is None else f"{row['all_to_all_error']:.3f}"
        lines.append(
            f"{row['name']:<28} {max(row['planned_peak']) / mib:>11.2f} {max(row['measured_peak']) / mib:>13.2f} "
            f"{row['memory_error']:>8.4f} {row['comm_error']:>9.6f} {a2a:>8}"
        )
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    cases = selected(args.only)
    out = args.out or Path(tempfile.mkdtemp(prefix="plan-accuracy-"))
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        groups: dict[tuple[int, int], list[Case]] = {}
        for case in cases:
            groups.setdefault((case.procs, case.per_node), []).append(case)
        for (world, per_node), members in groups.items():
            t = time.perf_counter()
            mp.start_processes(rank_main, args=(world, per_node, _free_port(), members, args.steps, str(out)),  # type: ignore[attr-defined,no-untyped-call]
                               nprocs=world, start_method="spawn")  # fmt: skip
            print(f"{world} processes ({per_node} per node): {len(members)} runs in {time.perf_counter() - t:.0f} s",
                  file=sys.stderr)  # fmt: skip
        rows = [compare(case, args.steps, out) for case in cases]
        print(table(rows))
        a2a = [row["all_to_all_error"] for row in rows if row["all_to_all_error"] is not None]
        print(json.dumps({
            "max_memory_error": max(row["memory_error"] for row in rows),
            "max_comm_error": max(row["comm_error"] for row in rows),
            "max_all_to_all_error": max(a2a) if a2a else None,
            "all_to_all_note": "routing-dependent: planned as the uniform-routing expectation; not in max_comm_error",
            "targets": {"max_memory_error": 0.05, "max_comm_error": 0.001},
            "steps": args.steps,
            "scored_steps": "memory: steps 2.. (steady state, AdamW moments allocated); comm: every step",
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "total_s": round(time.perf_counter() - started),
            "rows": rows,
        }))  # fmt: skip
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
