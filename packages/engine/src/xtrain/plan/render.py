"""A plan, and the search's best candidates, as text for the terminal."""

from __future__ import annotations

from xtrain.plan.planner import Plan
from xtrain.plan.search import Candidate

GIB = 2**30


def _gib(n: float) -> str:
    return f"{n / GIB:,.2f} GiB"


def _bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"


def plan_text(plan: Plan) -> str:
    layout = plan.layout
    lines = [
        f"layout        {layout['gpus']} GPUs ({layout['gpus_per_node']} per node): replicate {layout['replicate']}"
        f" x shard {layout['shard']} x ep {layout['ep']}",
        f"device        {plan.assumptions['device']} ({_gib(plan.capacity_bytes)}), compute in "
        f"{plan.assumptions['compute_dtype']}",
        "",
        "memory per rank",
    ]
    lines += [f"  {name:<14}{_gib(size):>14}" for name, size in plan.parts.items()]
    verdict = "fits" if plan.fits else "DOES NOT FIT"
    lines += [
        f"  {'peak':<14}{_gib(plan.peak_bytes):>14}   {verdict} (margin {_gib(plan.margin_bytes)})",
        f"  {'host (offload)':<14}{_gib(plan.host_bytes):>14}",
        "",
        "per optimizer step (one rank sends)",
    ]
    for kind, links in plan.comm_bytes.items():
        lines.append(f"  {kind:<15}{_bytes(links['intra']):>12} inside the node {_bytes(links['inter']):>12} between")
    lines += [
        f"  {'FLOPs (all)':<15}{plan.flops_per_step:.4g}",
        "",
        f"estimate      {plan.step_time_s:.3f} s/step, {plan.tokens_per_s:,.0f} tokens/s, MFU {100 * plan.mfu:.1f}%",
        f"  compute {plan.compute_s:.3f} s; exposed: "
        + ", ".join(f"{name} {seconds:.3f} s" for name, seconds in plan.exposed_s.items()),
        f"  bottleneck: {plan.bottleneck} (assumptions: docs/plan.md)",
    ]
    return "\n".join(lines)


def search_text(ranked: list[Candidate], top: int = 5) -> str:
    lines = [f"{len(ranked)} combinations fit; the best {min(top, len(ranked))}:", ""]
    header = f"{'#':>2} {'tokens/s':>12} {'MFU':>6} {'peak':>11} {'margin':>11}  {'bottleneck':<11} settings"
    lines.append(header)
    for index, candidate in enumerate(ranked[:top], start=1):
        plan, s = candidate.plan, candidate.plan.settings
        settings = (
            f"replicate={s['replicate']} ep_size={s['ep_size']} domino_slices={s['domino_slices']} "
            f"checkpointing={s['checkpointing']} offload={str(s['offload']).lower()} pack_tokens={s['pack_tokens']} "
            f"global_batch={s['global_batch']}"
        )
        lines.append(
            f"{index:>2} {plan.tokens_per_s:>12,.0f} {100 * plan.mfu:>5.1f}% {_gib(plan.peak_bytes):>11} "
            f"{_gib(plan.margin_bytes):>11}  {plan.bottleneck:<11} {settings}"
        )
    return "\n".join(lines)
