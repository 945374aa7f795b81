"""Data-parallel balance: how unequal the ranks' attention work is at each micro-step, for three ways of giving
packs to ranks, with the trainer's own packing and balancing code (xtrain.data).

Documents: heavy-tailed lengths (lognormal, plus a share of documents as long as a whole pack) or, with
``--lengths FILE``, one document length per line (any real distribution). They are packed into packs of
``--pack-tokens`` (32k) by xtrain's packer; each optimizer step takes ``--global-batch`` packs (512 × 32k = 16M
tokens, the batch of a DeepSeek-V3-class pretraining run), so a rank runs global_batch / ranks micro-steps.

- ``random``: the packs in stream order, as without balance (rank r's micro-step j is pack r × micro + j);
- ``sort_deal``: within each window of ``--window`` steps the packs are sorted by cost and dealt round-robin to
  the ranks (the reference engine's method): rank r takes the r-th, (r + dp)-th, ... most expensive;
- ``xtrain``: ``data.balance_window = --window`` (xtrain.data.balance: packs formed again and placed by cost).

Cost of a pack: the sum of its documents' squared lengths (attention work). Figure: the mean over micro-steps of
(max over ranks / mean over ranks) of that cost; 1.0 is perfect balance. The same number of micro-steps is
simulated for each method.

Ends with one JSON line: {"ranks": {"8": {"random", "sort_deal", "xtrain"}, "64": {...}, "512": {...}}, ...}.
Target (issue 10): xtrain ≤ 1.02 at 64 ranks, and below sort_deal at every rank count.

Usage: python tools/bench/dp_balance.py [--ranks 8 64 512] [--window 4] [--global-batch 512] [--windows 4]
                                        [--pack-tokens 32768] [--lengths FILE] [--seed 0]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import numpy.typing as npt
from xtrain.data import Corpus
from xtrain.data.balance import BalancedLayouts, pack_cost
from xtrain.data.packing import PackBuilder, PackLayout


@dataclass(frozen=True)
class _Lengths:
    """What the packer reads of a source: its document lengths and its weight."""

    lengths: npt.NDArray[np.int64]
    weight: float = 1.0

    @property
    def num_documents(self) -> int:
        return len(self.lengths)


@dataclass(frozen=True)
class _LengthsCorpus:
    sources: tuple[_Lengths, ...]


def heavy_tailed_lengths(count: int, pack_tokens: int, seed: int, full_share: float) -> npt.NDArray[np.int64]:
    """Lognormal lengths (median ~1.1k tokens, a long tail) and a share of documents a whole pack long."""
    generator = np.random.default_rng(seed)
    lengths = np.clip(generator.lognormal(mean=7.0, sigma=1.4, size=count), 16, pack_tokens).astype(np.int64)
    lengths[generator.random(count) < full_share] = pack_tokens
    return lengths


def imbalance(step_layouts: list[list[PackLayout]], dp: int, micro: int) -> list[float]:
    """max/mean cost over ranks at every micro-step of the given steps (rank r's micro-step j: r × micro + j)."""
    figures = []
    for layouts in step_layouts:
        costs = np.asarray([pack_cost(layout.pieces) for layout in layouts], dtype=np.float64).reshape(dp, micro)
        figures.extend(float(column.max() / column.mean()) for column in costs.T if column.mean() > 0)
    return figures


def simulate(corpus: Corpus, dp: int, args: argparse.Namespace) -> dict[str, float]:
    global_batch = args.global_batch
    micro = global_batch // dp
    steps = args.window * args.windows

    plain = PackBuilder(corpus, args.pack_tokens, args.seed, lookahead=64)
    stream_order = [[plain.next_layout() for _ in range(global_batch)] for _ in range(steps)]

    dealt = []
    for start in range(0, steps, args.window):
        packs = [layout for step in stream_order[start : start + args.window] for layout in step]
        ranked = sorted(packs, key=lambda layout: -pack_cost(layout.pieces))
        per_rank = [ranked[r::dp] for r in range(dp)]  # round-robin: rank r's k-th pack is ranked[k × dp + r]
        for step in range(args.window):
            dealt.append([per_rank[r][step * micro + j] for r in range(dp) for j in range(micro)])
    assert sum(len(step) for step in dealt) == steps * global_batch

    balanced = BalancedLayouts(
        PackBuilder(corpus, args.pack_tokens, args.seed, lookahead=64),
        window_steps=args.window,
        global_batch=global_batch,
        dp=dp,
    )
    started = time.perf_counter()
    xtrain_steps = [balanced.next_step() for _ in range(steps)]
    plan_s = (time.perf_counter() - started) / args.windows

    result = {}
    for name, layouts in (("random", stream_order), ("sort_deal", dealt), ("xtrain", xtrain_steps)):
        result[name] = round(float(np.mean(imbalance(layouts, dp, micro))), 4)
    result["plan_s_per_window"] = round(plan_s, 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--window", type=int, default=4, help="data.balance_window: steps per window")
    parser.add_argument("--global-batch", type=int, default=512, help="packs per optimizer step")
    parser.add_argument("--windows", type=int, default=4, help="windows simulated per rank count")
    parser.add_argument("--pack-tokens", type=int, default=32768)
    parser.add_argument("--full-share", type=float, default=0.02, help="share of documents a whole pack long")
    parser.add_argument("--lengths", type=Path, help="one document length per line, instead of the synthetic ones")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    if args.lengths is not None:
        lengths = np.asarray([int(line) for line in args.lengths.read_text().split()], dtype=np.int64)
    else:
        lengths = heavy_tailed_lengths(2_000_000, args.pack_tokens, args.seed, args.full_share)
    corpus = cast(Corpus, _LengthsCorpus((_Lengths(lengths),)))
    figures = {}
    for dp in args.ranks:
        figures[str(dp)] = simulate(corpus, dp, args)
        print(f"{dp:4d} ranks: {figures[str(dp)]}", flush=True)
    print(
        json.dumps(
            {
                "ranks": figures,
                "window_steps": args.window,
                "global_batch": args.global_batch,
                "pack_tokens": args.pack_tokens,
                "lengths": str(args.lengths) if args.lengths else f"lognormal(7.0, 1.4) + {args.full_share:.0%} full",
                "date": datetime.date.today().isoformat(),
                "machine": platform.node(),
            }
        )
    )


if __name__ == "__main__":
    main()
