"""The long-pack claim, measured: do longer packs give each layer enough compute to hide FSDP's all-gather?

Trains the CPU-sized `debug` MoE (examples/debug_moe.toml: 4 layers, 8 experts, hidden 128) with xtrain's own
trainer under FSDP2 on 2 and 4 processes (gloo), one pack per rank per optimizer step, for each pack length of
`--packs` (512 to 8k tokens), with the PyTorch profiler over the last steps. deeptrace's own analysis of each run
directory (`analysis.run.analyse_run`, the engine of `deeptrace analyze`, on the Kineto traces) then gives per
pack length, as the mean over ranks of the complete profiled steps:

- exposed all-gather per step (report.json's `collective_kinds.all_gather.exposed_ms_per_step`);
- exposed reduce-scatter per step (`collective_kinds.reduce_scatter`: FSDP2's gradient reduce-scatters, which
  gloo runs as all-reduces and deeptrace names by the call that issued them); the remaining all-reduces (the
  loss's and the gradient norm's) beside it as `all_reduce`;
- compute per step (the steps' `compute_ms`).

With `parallel.ep_size = 2` (on 2 processes, pack `--ep-pack`) it adds the all-to-all exposure without and with
Domino (`parallel.domino_slices = 2`), and the bytes of parameters each rank receives through FSDP's all-gathers
per step and per layer, without and with EP (counted by wrapping `torch.distributed.all_gather_into_tensor`
in the ranks: output bytes × (group size − 1) / group size, what arrives from the other ranks).

The ranks of one world size are started once and train every configuration in turn (torch's import and the
process group are paid once). Run directories go to a temporary folder, deleted unless `--out` is given.

The spread: `exposed_all_gather_pct_ranks_min_max` (the ranks' own shares, min and max) and `step_ms_min_max`
(every rank's every profiled step).

Last line, JSON: {"exposed_all_gather_ms_per_step": {"2": {"512": .., ...}, "4": {...}}, ..., "ep": {...}}.

Usage: python tools/bench/pack_length_exposure.py [--procs 2,4] [--packs 512,1024,2048,4096,8192]
       [--steps 6] [--ep-pack 2048] [--no-ep] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from deeptrace.analysis.run import analyse_run
from deeptrace.report.schema import build_report
from xtrain.parallel.distributed import _free_port, close_distributed, init_distributed
from xtrain.train.launch import load_and_check
from xtrain.train.trainer import _train  # one configuration after another in the same process group

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "debug_moe.toml"
LAYERS = 4  # the debug model's


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--procs", default="2,4", help="world sizes, comma-separated")
    parser.add_argument("--packs", default="512,1024,2048,4096,8192", help="pack lengths in tokens")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per run; the profiler takes 2..last")
    parser.add_argument("--ep-pack", type=int, default=2048, help="pack length of the EP runs")
    parser.add_argument("--no-ep", action="store_true", help="skip the ep_size = 2 runs")
    parser.add_argument("--out", type=Path, default=None, help="keep the run directories here")
    return parser.parse_args()


def _overrides(world: int, pack: int, steps: int, ep: int = 1, domino: int = 1) -> tuple[str, ...]:
    profiled = list(range(2, steps + 1))
    return (f"data.pack_tokens={pack}", f"train.global_batch={world}", f"train.max_steps={steps}",
            f"trace.profile_steps={profiled}", f"parallel.ep_size={ep}",
            f"parallel.domino_slices={domino}", "eval.sources=[]", "eval.sample_prompts=[]")  # fmt: skip


def plans(world: int, args: argparse.Namespace) -> list[tuple[str, tuple[str, ...]]]:
    """(run name, config overrides) of every run of one world size, in order."""
    packs = _ints(args.packs)
    if world == 2 and not args.no_ep and args.ep_pack not in packs:
        packs.append(args.ep_pack)  # the EP runs' baseline
    runs = [(f"w{world}-p{pack}", _overrides(world, pack, args.steps)) for pack in packs]
    if world == 2 and not args.no_ep:
        pack, steps = args.ep_pack, args.steps
        runs += [(f"w2-p{pack}-ep2", _overrides(2, pack, steps, ep=2)),
                 (f"w2-p{pack}-ep2-domino", _overrides(2, pack, steps, ep=2, domino=2))]  # fmt: skip
    return runs


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


class GatherCounter:
    """Counts the bytes that FSDP's all-gathers bring to this rank: wraps `dist.all_gather_single` (what FSDP2
    calls in this torch) and `dist.all_gather_into_tensor` (what it called before)."""

    def __init__(self) -> None:
        self.received = 0
        self.calls = 0
        for name in ("all_gather_single", "all_gather_into_tensor"):
            if hasattr(dist, name):
                setattr(dist, name, self._counted(getattr(dist, name)))

    def _counted(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(output_tensor: torch.Tensor, input_tensor: torch.Tensor, *a: Any, **kw: Any) -> Any:
            group = kw.get("group", a[0] if a else None)
            size = dist.get_world_size(group)
            self.received += output_tensor.numel() * output_tensor.element_size() * (size - 1) // size
            self.calls += 1
            return original(output_tensor, input_tensor, *a, **kw)

        return counted


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    torch.set_num_threads(1)  # 2 cores for up to 4 ranks: one thread each, as xtrain's launcher sets it
    dist_ctx = init_distributed("cpu")
    counter = GatherCounter()
    try:
        for name, overrides in plans(world, args):
            config = load_and_check(CONFIG, overrides)
            counter.received = counter.calls = 0
            started = time.perf_counter()
            _train(config, Path(out) / name, dist_ctx, "none", f"pack-length-exposure-{name}")
            figures = {"received_bytes": counter.received, "calls": counter.calls, "steps": args.steps,
                       "train_s": time.perf_counter() - started}  # fmt: skip
            Path(out, name, f"gathered-rank-{rank}.json").write_text(json.dumps(figures))
    finally:
        close_distributed()


def analyse(run_dir: Path) -> dict[str, float | None]:
    """deeptrace's figures of one run: mean over ranks of the per-step means."""
    report = build_report(analyse_run(run_dir, jobs=1, warn=lambda message: print(message, file=sys.stderr)))
    per_rank: dict[str, list[float]] = {}
    every_step: list[float] = []  # every rank's every profiled step: the step time's spread
    for _, rank in report.ranks_sorted():
        for kind in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all"):
            figures = rank.collective_kinds.get(kind)
            per_rank.setdefault(kind, []).append((figures.exposed_ms_per_step if figures else None) or 0.0)
            per_rank.setdefault(f"{kind}_pct", []).append((figures.exposed_pct_of_step if figures else None) or 0.0)
        per_rank.setdefault("compute", []).append(statistics.mean(s.compute_ms for s in rank.steps))
        per_rank.setdefault("step", []).append(statistics.mean(s.window_ms for s in rank.steps))
        every_step.extend(s.window_ms for s in rank.steps)
    gathered = [json.loads(p.read_text()) for p in sorted(run_dir.glob("gathered-rank-*.json"))]
    received_per_step = statistics.mean(g["received_bytes"] / g["steps"] for g in gathered)
    return {name: round(statistics.mean(values), 3) for name, values in per_rank.items()} | {
        "gathered_bytes_per_step": round(received_per_step),
        "gathered_bytes_per_layer": round(received_per_step / LAYERS),
        "train_s": round(max(g["train_s"] for g in gathered), 1),
        # The spread: the ranks' own figures of the exposed all-gather share, and every profiled step's time.
        "all_gather_pct_min": round(min(per_rank["all_gather_pct"]), 3),
        "all_gather_pct_max": round(max(per_rank["all_gather_pct"]), 3),
        "step_min": round(min(every_step), 3),
        "step_max": round(max(every_step), 3),
    }


def main() -> None:
    args = parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="pack-exposure-"))
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    figures: dict[str, dict[str, float | None]] = {}
    try:
        for world in _ints(args.procs):
            t = time.perf_counter()
            mp.start_processes(rank_main, args=(world, _free_port(), args, str(out)), nprocs=world,
                               start_method="spawn")  # fmt: skip
            print(f"{world} processes: trained in {time.perf_counter() - t:.0f} s", file=sys.stderr)
            for name, _ in plans(world, args):
                figures[name] = analyse(out / name)
                print(f"{name}: {figures[name]}", file=sys.stderr)
        print(json.dumps(summary(figures, args) | {"total_s": round(time.perf_counter() - started)}))
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)


def summary(figures: dict[str, dict[str, float | None]], args: argparse.Namespace) -> dict[str, Any]:
    def per_pack(key: str) -> dict[str, dict[str, float | None]]:
        return {str(w): {str(p): figures[f"w{w}-p{p}"][key] for p in _ints(args.packs)} for w in _ints(args.procs)}

    def spread(key: str) -> dict[str, dict[str, list[float | None]]]:
        return {
            str(w): {str(p): [figures[f"w{w}-p{p}"][f"{key}_min"], figures[f"w{w}-p{p}"][f"{key}_max"]]
                     for p in _ints(args.packs)}
            for w in _ints(args.procs)
        }  # fmt: skip

    result: dict[str, Any] = {
        "exposed_all_gather_ms_per_step": per_pack("all_gather"),
        "exposed_all_gather_pct_of_step": per_pack("all_gather_pct"),
        "exposed_reduce_scatter_ms_per_step": per_pack("reduce_scatter"),
        "exposed_reduce_scatter_pct_of_step": per_pack("reduce_scatter_pct"),
        "exposed_all_reduce_ms_per_step": per_pack("all_reduce"),
        "exposed_all_reduce_pct_of_step": per_pack("all_reduce_pct"),
        "compute_ms_per_step": per_pack("compute"),
        "step_ms": per_pack("step"),
        "exposed_all_gather_pct_ranks_min_max": spread("all_gather_pct"),
        "step_ms_min_max": spread("step"),
    }
    if not args.no_ep and 2 in _ints(args.procs):
        plain, ep, domino = (figures[f"w2-p{args.ep_pack}{suffix}"] for suffix in ("", "-ep2", "-ep2-domino"))
        result["ep"] = {
            "procs": 2,
            "pack": args.ep_pack,
            "exposed_all_to_all_ms_per_step": {"ep2": ep["all_to_all"], "ep2_domino": domino["all_to_all"]},
            "step_ms": {"ep1": plain["step"], "ep2": ep["step"], "ep2_domino": domino["step"]},
            "param_bytes_gathered_per_layer": {
                "ep1": plain["gathered_bytes_per_layer"],
                "ep2": ep["gathered_bytes_per_layer"],
                "ep2_domino": domino["gathered_bytes_per_layer"],
            },
        }
    machine = f"{platform.node()}, {os.cpu_count()} cores"
    return result | {"steps": args.steps, "model": "debug", "torch": torch.__version__, "machine": machine,
                     "date": time.strftime("%Y-%m-%d")}  # fmt: skip


if __name__ == "__main__":
    main()
