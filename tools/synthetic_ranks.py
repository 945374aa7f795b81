"""Synthetic collector records of a large run: N ranks of an HSDP + EP MoE training step, seeded, one planted
straggler. For `tools/bench/deeptrace_ranks.py` (deeptrace analyze and diff at 1,024 ranks) and for trying
deeptrace on a world size no test machine has.

The ranks are simulated together, collective by collective, so that the records are what real ranks would write:
a collective ends at the same time on every rank of its group (the last arrival plus the transfer), and a rank
that arrives early waits inside it. Layout: shard groups of `--shard` ranks (FSDP and EP inside them, group names
`fsdp-G` and `ep-G`), replica groups across them (`replicate-K`). Per step and layer:

    forward   all_gather of the layer's parameters (prefetched: launched when the previous layer's compute starts),
              the layer's compute; on MoE layers (every other one) all_to_all dispatch, expert compute,
              all_to_all combine (blocking)
    backward  in reverse: the all-gather again (prefetched), backward compute (twice the forward's), the MoE
              exchanges, then the gradients' reduce_scatter (asynchronous, waited for at the step's end)
    end       all_reduce of the gradients across the replica group (HSDP), optimizer compute

Times are log-normally jittered per rank and op from the seed; the straggler's compute takes `--slow` times
longer, so it arrives last at most collectives and the others wait for it. Written with deeptrace's own Collector
(`Collector.record`), one trace/rank-R.dtr per rank, plus meta.json.

Usage: python tools/synthetic_ranks.py OUT [--ranks 1024] [--steps 4] [--layers 8] [--seed 0] [--straggler R]
       [--slow 1.3] [--shard 8]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
from deeptrace.collect import Collector
from deeptrace.rundir import RunMeta, layout
from deeptrace.rundir.jsonio import dumps, write_atomically
from deeptrace.spans import Category

US = 1_000
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Plan:
    ranks: int = 1024
    steps: int = 4
    layers: int = 8
    seed: int = 0
    straggler: int | None = None
    slow: float = 1.3  # the straggler's compute takes this many times longer
    shard: int = 8  # ranks per FSDP / EP group; replica groups across them
    layer_compute_us: float = 800.0
    gather_us: float = 600.0  # transfer time of a layer's all-gather
    gather_bytes: int = 48 << 20
    exchange_us: float = 300.0
    exchange_bytes: int = 8 << 20
    all_reduce_us: float = 2000.0
    jitter: float = 0.05  # sigma of the log-normal noise on every duration

    @property
    def gather(self) -> tuple[float, int]:
        """(transfer µs, bytes) of a layer's all-gather, and of its gradients' reduce-scatter."""
        return self.gather_us, self.gather_bytes

    @property
    def exchange(self) -> tuple[float, int]:
        return self.exchange_us, self.exchange_bytes


@dataclass
class _Span:
    name: str
    category: Category
    start: F64  # ns, one per rank
    end: F64
    step: int
    group: list[str] | None = None  # per rank
    seq: int | None = None
    nbytes: int | None = None
    track: str = "main"


@dataclass
class _Sim:
    """Every rank's clock and what it recorded, advanced op by op for all ranks at once."""

    plan: Plan
    rng: np.random.Generator
    t: F64
    speed: F64
    spans: list[_Span] = field(default_factory=list)
    seqs: dict[str, int] = field(default_factory=dict)

    def noise(self, mean_us: float) -> F64:
        return mean_us * US * self.rng.lognormal(0.0, self.plan.jitter, self.plan.ranks)

    def compute(self, name: str, step: int, mean_us: float) -> None:
        start = self.t.copy()
        self.t = start + self.noise(mean_us) * self.speed
        self.spans.append(_Span(name, Category.COMPUTE, start, self.t.copy(), step))

    def collective(self, name: str, kind: str, step: int, *, cost: tuple[float, int], track: str) -> F64:
        """A collective entered now by every rank (of every group of `kind`); returns when it ends on each rank."""
        groups = _group_of(self.plan, kind)
        arrival = self.t.copy()
        last = np.zeros(self.plan.ranks)
        np.maximum.at(last, groups, arrival)  # the latest arrival in each group
        mean_us, nbytes = cost
        transfer = mean_us * US * self.rng.lognormal(0.0, self.plan.jitter, int(groups.max()) + 1)
        end = last[groups] + transfer[groups]
        seq = self.seqs.get(kind, 0)
        self.seqs[kind] = seq + 1
        names = [f"{kind}-{g}" for g in groups.tolist()]
        self.spans.append(_Span(name, Category.COMM, arrival, end, step, names, seq, nbytes, track))
        return end


def _group_of(plan: Plan, kind: str) -> npt.NDArray[np.int64]:
    ranks = np.arange(plan.ranks)
    return ranks % plan.shard if kind == "replicate" else ranks // plan.shard


def simulate(plan: Plan) -> list[_Span]:
    """Every span of every rank, as arrays over the ranks."""
    rng = np.random.default_rng(plan.seed)
    speed = np.ones(plan.ranks)
    if plan.straggler is not None:
        speed[plan.straggler] = plan.slow
    sim = _Sim(plan, rng, t=np.zeros(plan.ranks), speed=speed)
    for step in range(plan.steps):
        sim.t += 200 * US  # data loading, the same everywhere
        _forward(sim, step)
        pending = _backward(sim, step)
        for done in pending:  # the step waits for its reduce-scatters
            sim.t = np.maximum(sim.t, done)
        sim.t = sim.collective(
            "all_reduce grads", "replicate", step, cost=(plan.all_reduce_us, plan.gather_bytes), track="ar"
        )
        sim.compute("optimizer", step, 300.0)
    return sim.spans


def _forward(sim: _Sim, step: int) -> None:
    plan = sim.plan
    gathered = sim.collective("all_gather params", "fsdp", step, cost=plan.gather, track="ag")
    for layer in range(plan.layers):
        sim.t = np.maximum(sim.t, gathered)  # wait for this layer's parameters
        if layer + 1 < plan.layers:  # prefetch the next layer's while this one computes
            gathered = sim.collective("all_gather params", "fsdp", step, cost=plan.gather, track="ag")
        sim.compute(f"forward layer {layer}", step, plan.layer_compute_us)
        if layer % 2 == 1:
            _moe(sim, step, "forward", 1.0)


def _backward(sim: _Sim, step: int) -> list[F64]:
    plan = sim.plan
    pending = []
    gathered = sim.collective("all_gather params", "fsdp", step, cost=plan.gather, track="ag")
    for layer in reversed(range(plan.layers)):
        sim.t = np.maximum(sim.t, gathered)
        if layer > 0:
            gathered = sim.collective("all_gather params", "fsdp", step, cost=plan.gather, track="ag")
        if layer % 2 == 1:
            _moe(sim, step, "backward", 2.0)
        sim.compute(f"backward layer {layer}", step, 2 * plan.layer_compute_us)
        lane = f"rs-{layer % 4}"  # up to four reduce-scatters in flight, each on a track of its own
        pending.append(sim.collective("reduce_scatter grads", "fsdp", step, cost=plan.gather, track=lane))
    return pending


def _moe(sim: _Sim, step: int, phase: str, scale: float) -> None:
    plan = sim.plan
    sim.t = sim.collective("all_to_all dispatch", "ep", step, cost=plan.exchange, track="a2a")
    sim.compute(f"experts {phase}", step, scale * plan.layer_compute_us)
    sim.t = sim.collective("all_to_all combine", "ep", step, cost=plan.exchange, track="a2a")


def write_run(out: Path, plan: Plan) -> int:
    """Simulate and write the run directory; returns the number of spans written."""
    spans = simulate(plan)
    base = time.monotonic_ns()
    for rank in range(plan.ranks):
        with Collector(out, rank, plan.ranks, heartbeat_interval_s=None) as collector:
            for s in spans:
                collector.record(
                    s.name, s.category, base + int(s.start[rank]), base + int(s.end[rank]), step=s.step,
                    group=None if s.group is None else s.group[rank], seq=s.seq, nbytes=s.nbytes, track=s.track,
                )  # fmt: skip
    meta = RunMeta(
        run_id=f"synthetic-{plan.ranks}-seed{plan.seed}",
        start_time_unix_s=time.time(),
        world_size=plan.ranks,
        hosts=[f"node{n}" for n in range(plan.ranks // plan.shard)],
        rank_hosts={r: f"node{r // plan.shard}" for r in range(plan.ranks)},
        versions={"generator": "tools/synthetic_ranks.py"},
        extras={"straggler": plan.straggler, "seed": plan.seed},
    )
    write_atomically(layout.meta_path(out), dumps(meta.to_dict()))
    return len(spans) * plan.ranks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--straggler", type=int, default=None)
    parser.add_argument("--slow", type=float, default=1.3)
    parser.add_argument("--shard", type=int, default=8)
    args = parser.parse_args()
    plan = Plan(ranks=args.ranks, steps=args.steps, layers=args.layers, seed=args.seed, straggler=args.straggler,
                slow=args.slow, shard=args.shard)  # fmt: skip
    spans = write_run(args.out, plan)
    print(f"{args.out}: {args.ranks} ranks, {spans} spans")


if __name__ == "__main__":
    main()
