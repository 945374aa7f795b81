"""Forward+backward of one MoE block: xtrain's against transformers' Qwen3-MoE sparse block, side by side.

Shape (issue 3, part 8): 4096 tokens, hidden 1024, 64 experts, top-8, expert hidden 256; fp32 and bf16 on the CPU
(and on CUDA when present). Every implementation holds identical weights and sees the same input and output
gradient: xtrain's MoEBlock, and transformers' block in each of its experts implementations (`eager`,
`batched_mm`, `grouped_mm`, set through `config._experts_implementation`).

Per implementation, in this order:
1. a fresh subprocess under an address-space cap (RLIMIT_AS) runs one step: it reports the output and input
   gradient (compared against transformers' eager block), and the peak memory of the step after a warm-up
   step, measured as peak RSS delta = VmHWM after the step - RSS before it, with VmHWM reset through
   /proc/self/clear_refs just before the step (the process holds nothing else; on CUDA
   max_memory_allocated minus memory_allocated before). An implementation that fails there (batched_mm
   gathers one weight matrix per token-expert slot: about 64 GiB at this shape) is reported as failed with its
   reason; its expected allocation is printed before it runs;
2. the implementations that passed are timed in this process, interleaved round by round with the ceiling so
   the drift of a shared machine hits all alike; the figure is the best round (min wall time; the process CPU
   time is printed beside it), and the spread is the per-round ratio's min and max (round i of transformers'
   fastest over round i of xtrain).
The ceiling is one dense matmul doing the same number of FLOPs as the block's forward+backward matmuls, in the
same dtype. Whether torch maps large CPU allocations with huge pages (`THP_MEM_ALLOC_ENABLE=1` in the
environment, for every implementation alike) is recorded in the JSON line.

Ends with one JSON line; its top-level figures are the worst over the dtypes/devices measured:
  speedup_vs_hf_best          transformers' fastest time / xtrain's time (xtrain: the default block, experts_impl
                              "auto", whose path is `xtrain_path` in each run)
  speedup_vs_hf_best_min_max  the per-round ratios' min and max (the spread)
  fraction_of_matmul_peak     xtrain's matmul FLOP/s / the dense matmul's FLOP/s
  max_abs_diff                max |xtrain - transformers eager| over the output
  mem_ratio_vs_hf_best        xtrain's peak RSS delta / that of transformers' fastest implementation
the same with the suffix `_grouped_mm` for the block forced onto torch's grouped matmul (experts_impl="grouped_mm",
the default before the automatic choice), `wall_s`, and `runs`, the figures of every dtype/device.
Targets: speedup_vs_hf_best >= 1.5 (Qwen3 shape) / >= 1.3 (`--family deepseek-v3`) at mem_ratio_vs_hf_best <= 1,
fraction_of_matmul_peak >= 0.7.

Usage: python tools/bench/moe_block.py [--family qwen3|deepseek-v3] [--dtypes float32,bfloat16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# "xtrain" is the default block (experts_impl="auto": the figures the targets apply to); "xtrain_grouped_mm" the
# block forced onto torch's grouped matmul (the default before the automatic choice), measured beside it.
IMPLS = ("xtrain", "xtrain_grouped_mm", "hf_eager", "hf_batched_mm", "hf_grouped_mm")
XTRAIN_IMPL = {"xtrain": "auto", "xtrain_grouped_mm": "grouped_mm"}


@dataclass(frozen=True)
class Shape:
    tokens: int
    hidden: int
    experts: int
    top_k: int
    inter: int
    family: str = "qwen3"
    """``qwen3``: Qwen3-MoE's softmax top-k block. ``deepseek-v3``: DeepSeek-V3's block (sigmoid scores with the
    correction bias, group-limited top-k over ``DEEPSEEK_GROUPS``, routed scaling, one shared expert of
    ``inter``)."""

    @property
    def shared_inter(self) -> int:
        return self.inter if self.family == "deepseek-v3" else 0

    @property
    def matmul_flops(self) -> float:
        """FLOPs of forward+backward matmuls: experts (gate_up, down), the shared expert and the router; backward
        costs twice forward."""
        slots = self.tokens * self.top_k
        forward = 2 * slots * self.hidden * 3 * self.inter + 2 * self.tokens * self.hidden * self.experts
        forward += 2 * self.tokens * self.hidden * 3 * self.shared_inter
        return 3.0 * forward


# DeepSeek-V3's routing at its published ratios: 8 groups of experts, each token's experts from its best 4 groups,
# routed weights scaled by 2.5.
DEEPSEEK_GROUPS = {"n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5}


def build(impl: str, shape: Shape, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """The block of `impl` with the benchmark's seeded weights (identical for every implementation)."""
    if shape.family == "deepseek-v3":
        return build_deepseek(impl, shape).to(device=device, dtype=dtype)
    gen = torch.Generator().manual_seed(1234)
    e, d, f = shape.experts, shape.hidden, shape.inter
    router = torch.randn(e, d, generator=gen) * 0.02
    gate_up = torch.randn(e, 2 * f, d, generator=gen) * 0.02
    down = torch.randn(e, d, f, generator=gen) * 0.02
    if impl.startswith("xtrain"):
        from xtrain.model.moe import MoEBlock, MoEConfig

        cfg = MoEConfig(
            num_experts=e, num_experts_per_tok=shape.top_k, moe_intermediate_size=f, norm_topk_prob=True,
            experts_impl=XTRAIN_IMPL[impl],
        )  # fmt: skip
        block: torch.nn.Module = MoEBlock(d, cfg)
        block.load_state_dict({"router.weight": router, "experts.gate_up_proj": gate_up, "experts.down_proj": down})
    else:
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

        hf_cfg = Qwen3MoeConfig(
            hidden_size=d, moe_intermediate_size=f, num_experts=e, num_experts_per_tok=shape.top_k, norm_topk_prob=True
        )
        hf_cfg._experts_implementation = impl.removeprefix("hf_")
        block = Qwen3MoeSparseMoeBlock(hf_cfg)
        block.load_state_dict({"gate.weight": router, "experts.gate_up_proj": gate_up, "experts.down_proj": down})
    return block.to(device=device, dtype=dtype)


def build_deepseek(impl: str, shape: Shape) -> torch.nn.Module:
    """transformers' DeepseekV3MoE with seeded weights (every parameter and the correction bias drawn from one
    generator), or xtrain's MoEBlock holding the same; each check process builds the same block anew."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    hf_cfg = DeepseekV3Config(
        hidden_size=shape.hidden, moe_intermediate_size=shape.inter, n_routed_experts=shape.experts,
        num_experts_per_tok=shape.top_k, n_shared_experts=1, norm_topk_prob=True, **DEEPSEEK_GROUPS,
    )  # fmt: skip
    hf_cfg._experts_implementation = impl.removeprefix("hf_") if impl.startswith("hf_") else "eager"
    hf = DeepseekV3MoE(hf_cfg)
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        seeded = [*sorted(hf.named_parameters()), ("gate.e_score_correction_bias", hf.gate.e_score_correction_bias)]
        for name, param in seeded:
            param.copy_(torch.randn(param.shape, generator=gen) * (0.01 if "bias" in name else 0.02))
    if not impl.startswith("xtrain"):
        return hf
    from xtrain.model.moe import MoEBlock, MoEConfig

    cfg_dict = hf_cfg.to_dict() | {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}
    cfg = MoEConfig.from_hf_config(cfg_dict).model_copy(update={"experts_impl": XTRAIN_IMPL[impl]})
    ours = MoEBlock(shape.hidden, cfg)
    state = {
        "router.weight": hf.gate.weight,
        "router.e_score_correction_bias": hf.gate.e_score_correction_bias,
        "experts.gate_up_proj": hf.experts.gate_up_proj,
        "experts.down_proj": hf.experts.down_proj,
    }
    for name in ("gate_proj", "up_proj", "down_proj"):
        state[f"shared_experts.{name}.weight"] = getattr(hf.shared_experts, name).weight
    ours.load_state_dict({key: value.detach().clone() for key, value in state.items()})
    return ours


def inputs(shape: Shape, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(99)
    x = torch.randn(shape.tokens, shape.hidden, generator=gen)
    grad_y = torch.randn(shape.tokens, shape.hidden, generator=gen)
    return x.to(device=device, dtype=dtype), grad_y.to(device=device, dtype=dtype)


def make_step(impl: str, block: torch.nn.Module, x: torch.Tensor, grad_y: torch.Tensor) -> Callable[[], Any]:
    """One forward+backward; returns (y, x.grad)."""

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        block.zero_grad(set_to_none=True)
        xg = x.detach().requires_grad_(True)
        y = block(xg)[0] if impl.startswith("xtrain") else block(xg.unsqueeze(0)).squeeze(0)
        y.backward(grad_y)
        assert xg.grad is not None
        return y.detach(), xg.grad

    return step


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def expected_bytes(impl: str, shape: Shape, dtype: torch.dtype) -> int:
    """Largest single allocation one would expect of the implementation (for the guard's message)."""
    elem = torch.empty(0, dtype=dtype).element_size()
    slots = shape.tokens * shape.top_k
    if impl == "hf_batched_mm":  # one [2F, D] weight gathered per token-expert slot
        return slots * 2 * shape.inter * shape.hidden * elem
    return slots * shape.hidden * elem


# ---------------------------------------------------------------- worker: one step in a fresh capped process


def rss_bytes() -> int:
    with Path("/proc/self/statm").open() as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    with Path("/proc/self/status").open() as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def worker(args: argparse.Namespace) -> None:
    shape = Shape(args.tokens, args.hidden, args.experts, args.top_k, args.inter, args.family)
    dtype, device = getattr(torch, args.dtype), args.device
    block = build(args.worker, shape, dtype, device)
    x, grad_y = inputs(shape, dtype, device)
    step = make_step(args.worker, block, x, grad_y)
    result: dict[str, Any] = {}
    try:
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            y, gx = step()
            sync(device)
            result["peak_bytes"] = torch.cuda.max_memory_allocated() - before
            result["peak_kind"] = "cuda max_memory_allocated delta"
        else:
            step()  # warm-up: lazy initialisation of kernels and thread pools is not the step's memory
            gc.collect()
            before = rss_bytes()
            Path("/proc/self/clear_refs").write_text("5")  # resets the peak RSS (VmHWM) to the current RSS
            y, gx = step()
            result["peak_bytes"] = peak_rss_bytes() - before
            result["peak_kind"] = "peak RSS delta (VmHWM reset before the step, minus RSS then)"
        torch.save({"y": y.float().cpu(), "gx": gx.float().cpu()}, args.out)
        result["ok"] = True
        experts = getattr(block, "experts", None)
        if args.worker.startswith("xtrain") and hasattr(experts, "path_for"):
            result["path"] = experts.path_for(x)  # type: ignore[union-attr]  # xtrain's GroupedExperts
    except (RuntimeError, MemoryError) as err:
        result = {"ok": False, "reason": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
    print("RESULT " + json.dumps(result), flush=True)


def run_worker(impl: str, args: argparse.Namespace, run: tuple[str, str], out: Path, cap: int) -> dict[str, Any]:
    dtype, device = run
    cmd = [sys.executable, __file__, "--worker", impl, "--dtype", dtype, "--device", device, "--out", str(out)]
    cmd += ["--tokens", str(args.tokens), "--hidden", str(args.hidden), "--experts", str(args.experts)]
    cmd += ["--top-k", str(args.top_k), "--inter", str(args.inter), "--family", args.family]
    if args.threads:
        cmd += ["--threads", str(args.threads)]

    def limit() -> None:
        # A failing implementation must fail inside its own process, not push the shared machine into swap.
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=limit, check=False, timeout=1800)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
            return result
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"ok": False, "reason": f"exit code {proc.returncode}: {tail[:300]}"}


# ---------------------------------------------------------------- driver


def dense_matmul(shape: Shape, dtype: torch.dtype, device: str) -> tuple[Callable[[], Any], float]:
    """One dense [S, D] @ [D, N] matmul doing the block's forward+backward matmul FLOPs, and its FLOPs."""
    slots = shape.tokens * shape.top_k
    n = round(shape.matmul_flops / (2 * slots * shape.hidden))
    a = torch.randn(slots, shape.hidden, device=device).to(dtype)
    b = torch.randn(shape.hidden, n, device=device).to(dtype)
    return (lambda: torch.mm(a, b)), 2.0 * slots * shape.hidden * n


def bench_one(args: argparse.Namespace, shape: Shape, dtype_name: str, device: str, cap: int) -> dict[str, Any]:
    dtype = getattr(torch, dtype_name)
    impls = [impl for impl in IMPLS if impl in args.impls.split(",")]
    print(f"\n== {device} {dtype_name}: {shape}", flush=True)
    checks: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for impl in impls:
            want = expected_bytes(impl, shape, dtype)
            note = f" (expects a {want / 2**30:.1f} GiB allocation, cap {cap / 2**30:.1f} GiB)" if want > cap else ""
            print(f"  check {impl:15s}{note}", flush=True)
            out = Path(tmp) / f"{impl}.pt"
            checks[impl] = run_worker(impl, args, (dtype_name, device), out, cap)
            if checks[impl]["ok"]:
                checks[impl]["tensors"] = torch.load(out)
        # transformers' eager block is the reference; its grouped_mm one when eager was not asked for.
        ref_impl = "hf_eager" if "hf_eager" in checks else "hf_grouped_mm"
        ref = checks.get(ref_impl, {}).get("tensors")
        for c in checks.values():
            if c["ok"] and ref is not None:
                c["max_abs_diff_y"] = float((c["tensors"]["y"] - ref["y"]).abs().max())
                c["max_abs_diff_grad_x"] = float((c["tensors"]["gx"] - ref["gx"]).abs().max())
            c.pop("tensors", None)

    timed = [impl for impl in impls if checks[impl]["ok"]]
    steps = {}
    for impl in timed:
        block = build(impl, shape, dtype, device)
        x, grad_y = inputs(shape, dtype, device)
        steps[impl] = make_step(impl, block, x, grad_y)
        steps[impl]()  # warm-up
    # The ceiling runs in the same rounds, so the machine's drift hits it like the blocks.
    steps["dense_matmul"], dense_flops = dense_matmul(shape, dtype, device)
    steps["dense_matmul"]()
    timed_and_ceiling = [*timed, "dense_matmul"]
    rounds: dict[str, list[float]] = {impl: [] for impl in timed_and_ceiling}
    rounds_cpu: dict[str, list[float]] = {impl: [] for impl in timed_and_ceiling}
    for _ in range(args.rounds):
        for impl in timed_and_ceiling:
            sync(device)
            start, start_cpu = time.perf_counter(), time.process_time()
            steps[impl]()
            sync(device)
            rounds[impl].append(time.perf_counter() - start)
            rounds_cpu[impl].append(time.process_time() - start_cpu)
    best = {impl: min(times) for impl, times in rounds.items()}
    best_cpu = {impl: min(times) for impl, times in rounds_cpu.items()}
    steps.clear()
    ceiling = dense_flops / best["dense_matmul"]

    header = ("time s", "cpu s", "GFLOP/s", "peak MiB", "|dy| max", "|dx| max")
    print(f"  {'implementation':15s} " + " ".join(f"{h:>9s}" for h in header))
    for impl in impls:
        c = checks[impl]
        if not c["ok"]:
            print(f"  {impl:15s} FAILED: {c['reason']}")
            continue
        gflops = shape.matmul_flops / best[impl] / 1e9
        print(
            f"  {impl:15s} {best[impl]:9.3f} {best_cpu[impl]:9.3f} {gflops:9.1f} {c['peak_bytes'] / 2**20:9.0f} "
            f"{c.get('max_abs_diff_y', float('nan')):9.2e} {c.get('max_abs_diff_grad_x', float('nan')):9.2e}"
        )
    print(f"  dense matmul ceiling: {ceiling / 1e9:.1f} GFLOP/s; peak memory = {checks['xtrain'].get('peak_kind')}")

    hf_ok = [impl for impl in timed if impl.startswith("hf_")]
    if "xtrain" not in timed or not hf_ok:
        return {"device": device, "dtype": dtype_name, "checks": checks, "error": "xtrain or every HF impl failed"}
    hf_best = min(hf_ok, key=lambda impl: best[impl])

    def against(impl: str) -> dict[str, Any]:
        per_round = [h / x for h, x in zip(rounds[hf_best], rounds[impl], strict=True)]
        return {
            "speedup_vs_hf_best": best[hf_best] / best[impl],
            "speedup_vs_hf_best_min_max": [round(min(per_round), 3), round(max(per_round), 3)],
            "fraction_of_matmul_peak": shape.matmul_flops / best[impl] / ceiling,
            "mem_ratio_vs_hf_best": checks[impl]["peak_bytes"] / checks[hf_best]["peak_bytes"],
        }

    grouped = against("xtrain_grouped_mm") if "xtrain_grouped_mm" in timed else {}
    return {
        "device": device,
        "dtype": dtype_name,
        **against("xtrain"),
        "xtrain_path": checks["xtrain"].get("path"),
        "hf_best": hf_best,
        "max_abs_diff": checks["xtrain"]["max_abs_diff_y"],
        "max_abs_diff_grad_x": checks["xtrain"]["max_abs_diff_grad_x"],
        "speedup_vs_hf_best_cpu_time": min(best_cpu[i] for i in hf_ok) / best_cpu["xtrain"],
        "time_s": {impl: round(best[impl], 4) for impl in timed},
        "time_s_min_max": {impl: [round(min(rounds[impl]), 4), round(max(rounds[impl]), 4)] for impl in timed},
        "cpu_time_s": {impl: round(best_cpu[impl], 4) for impl in timed},
        "peak_mib": {impl: round(checks[impl]["peak_bytes"] / 2**20) for impl in timed},
        "failed": {impl: checks[impl]["reason"] for impl in impls if not checks[impl]["ok"]},
        "matmul_ceiling_gflops": round(ceiling / 1e9, 1),
        **{f"{key}_grouped_mm": value for key, value in grouped.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--inter", type=int, default=256)
    parser.add_argument(
        "--family", choices=("qwen3", "deepseek-v3"), default="qwen3",
        help="deepseek-v3: its block (group-limited sigmoid routing, a shared expert); try --experts 256",
    )  # fmt: skip
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (best kept; spread: min-max)")
    parser.add_argument("--impls", default=",".join(IMPLS), help="subset of " + ",".join(IMPLS))
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--mem-cap-gib", type=float, default=None, help="address-space cap of each check process")
    parser.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker:
        worker(args)
        return

    started = time.perf_counter()
    shape = Shape(args.tokens, args.hidden, args.experts, args.top_k, args.inter, args.family)
    with Path("/proc/meminfo").open() as f:
        available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    # Address space, not resident memory: leave room for the libraries' mappings above the data itself.
    cap = int(args.mem_cap_gib * 2**30) if args.mem_cap_gib else int(min(available * 0.6, 16 * 2**30))
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    thp = os.environ.get("THP_MEM_ALLOC_ENABLE") == "1"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, devices {devices}, THP allocations {thp}")
    runs = [bench_one(args, shape, dt, dev, cap) for dev in devices for dt in args.dtypes.split(",")]
    good = [r for r in runs if "error" not in r]
    worst = {"speedup_vs_hf_best": min, "fraction_of_matmul_peak": min, "mem_ratio_vs_hf_best": max}
    summary: dict[str, Any] = {
        "bench": "moe_block",
        "shape": dataclasses.asdict(shape),
        "threads": torch.get_num_threads(),
        "thp_mem_alloc": thp,
        "max_abs_diff": max(r["max_abs_diff"] for r in good) if good else None,
    }
    for suffix in ("", "_grouped_mm"):
        measured = [r for r in good if f"speedup_vs_hf_best{suffix}" in r]
        if not measured:
            continue
        for key, pick in worst.items():
            summary[f"{key}{suffix}"] = round(pick(r[f"{key}{suffix}"] for r in measured), 3)
        # The spread of the run the top-level speedup comes from (the worst one).
        worst_run = min(measured, key=lambda r: r[f"speedup_vs_hf_best{suffix}"])
        summary[f"speedup_vs_hf_best_min_max{suffix}"] = worst_run[f"speedup_vs_hf_best_min_max{suffix}"]
    summary["xtrain_path"] = {f"{r['device']}/{r['dtype']}": r.get("xtrain_path") for r in good}
    summary["wall_s"] = round(time.perf_counter() - started, 1)
    summary["runs"] = runs
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
