"""`deeptrace analyze` and `deeptrace diff` on 1,024 ranks of synthetic collector records, one planted straggler.

Generates two run directories with `tools/synthetic_ranks.py` (HSDP + EP MoE steps, seeded; see there), in a
temporary folder deleted afterwards: A without a straggler, B the same seed with rank `--straggler` computing
`--slow` times longer. Then, each in a fresh subprocess, measures wall time, CPU time and peak RSS of the whole
process tree (polled every 100 ms, as tools/bench/deeptrace_scale.py does) of

  deeptrace analyze B --json --no-png      (the straggler must be the verdict's only culprit)
  deeptrace diff A B --json --step all      (the straggler must be the rank whose exposed communication fell most:
                                             the others now wait for it, it waits for nobody)

and, to show that memory stays bounded as the rank count grows, the same analyze at `--small` ranks. Analyze and
diff run `--repeats` times each (default 3): their figures are the medians, with the runs' wall-time min and max
as the spread (`*_wall_s_min_max`) and the largest peak RSS.

Last line, JSON: {"ranks": .., "analyze_wall_s": .., "analyze_peak_rss_mib": .., "diff_wall_s": .., ...,
"straggler_named": true}.

Usage: python tools/bench/deeptrace_ranks.py [--ranks 1024] [--small 128] [--straggler 737] [--seed 0] [--jobs N]
       [--repeats 3]
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
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from deeptrace_scale import measure  # type: ignore[import-not-found]  # noqa: E402  # the Kineto benchmark's measure
from synthetic_ranks import Plan, write_run  # type: ignore[import-not-found]  # noqa: E402

DEEPTRACE = str(Path(sys.executable).parent / "deeptrace")


def _analyze(run: Path, out: Path, jobs: list[str]) -> tuple[float, float, int, dict[str, Any]]:
    wall, cpu, rss, printed = measure([DEEPTRACE, "analyze", str(run), "--json", "--no-png", "-o", str(out), *jobs],
                                      out.parent)  # fmt: skip
    return wall, cpu, rss, json.loads(printed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--small", type=int, default=128, help="also analyse this many ranks (0: skip)")
    parser.add_argument("--straggler", type=int, default=None, help="default: rank 737 of 1024, scaled")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slow", type=float, default=1.3)
    parser.add_argument("--jobs", type=int, default=None, help="deeptrace's worker processes (default: its own)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of analyze and of diff (medians and spread)")
    args = parser.parse_args()
    straggler = args.straggler if args.straggler is not None else 737 * args.ranks // 1024
    jobs = [] if args.jobs is None else ["-j", str(args.jobs)]
    work = Path(tempfile.mkdtemp(prefix="deeptrace-ranks-"))
    try:
        t = time.perf_counter()
        spans = write_run(work / "a", Plan(ranks=args.ranks, seed=args.seed))
        write_run(work / "b", Plan(ranks=args.ranks, seed=args.seed, straggler=straggler, slow=args.slow))
        generate_s = time.perf_counter() - t
        size = sum(p.stat().st_size for p in (work / "b" / "trace").iterdir())
        print(f"generated 2 × {args.ranks} ranks, {spans // args.ranks} spans each, {size / 1e6:.0f} MB per run, "
              f"in {generate_s:.0f} s", file=sys.stderr)  # fmt: skip
        analyses = [_analyze(work / "b", work / "out-b", jobs) for _ in range(args.repeats)]
        a_walls = [run[0] for run in analyses]
        a_wall, a_cpu = statistics.median(a_walls), statistics.median(run[1] for run in analyses)
        a_rss, report = max(run[2] for run in analyses), analyses[-1][3]
        culprits = [c["rank"] for c in report["stragglers"]["culprits"]]
        print(f"analyze: {a_wall:.1f} s, peak RSS {a_rss / 2**20:.0f} MiB, culprits {culprits}", file=sys.stderr)
        diffs = [measure([DEEPTRACE, "diff", str(work / "a"), str(work / "b"), "--json", "--step", "all", *jobs],
                         work) for _ in range(args.repeats)]  # fmt: skip
        d_walls = [run[0] for run in diffs]
        d_wall, d_cpu = statistics.median(d_walls), statistics.median(run[1] for run in diffs)
        d_rss, diff = max(run[2] for run in diffs), json.loads(diffs[-1][3])
        fell_most = min(diff["ranks"], key=lambda r: r["delta_exposed_us"])["rank"]
        print(f"diff: {d_wall:.1f} s, peak RSS {d_rss / 2**20:.0f} MiB, exposed fell most on rank {fell_most}",
              file=sys.stderr)  # fmt: skip
        result: dict[str, Any] = {
            "ranks": args.ranks,
            "spans_per_rank": spans // args.ranks,
            "mb_per_run": round(size / 1e6, 1),
            "straggler_planted": straggler,
            "analyze_culprits": culprits,
            "diff_rank_exposed_fell_most": fell_most,
            "straggler_named": culprits == [straggler] and fell_most == straggler,
            "analyze_wall_s": round(a_wall, 2),
            "analyze_wall_s_min_max": [round(min(a_walls), 2), round(max(a_walls), 2)],
            "analyze_cpu_s": round(a_cpu, 2),
            "analyze_peak_rss_mib": round(a_rss / 2**20),
            "diff_wall_s": round(d_wall, 2),
            "diff_wall_s_min_max": [round(min(d_walls), 2), round(max(d_walls), 2)],
            "diff_cpu_s": round(d_cpu, 2),
            "diff_peak_rss_mib": round(d_rss / 2**20),
            "diff_ranks_rows": len(diff["ranks"]),
            "generate_s": round(generate_s, 1),
            "repeats": args.repeats,
        }
        if args.small:
            small = work / "small"
            write_run(small, Plan(ranks=args.small, seed=args.seed, straggler=straggler * args.small // args.ranks))
            s_wall, _, s_rss, _ = _analyze(small, work / "out-small", jobs)
            result |= {"small_ranks": args.small, "small_analyze_wall_s": round(s_wall, 2),
                       "small_analyze_peak_rss_mib": round(s_rss / 2**20)}  # fmt: skip
        result |= {"cpus": os.cpu_count(), "machine": platform.node(), "date": time.strftime("%Y-%m-%d")}
        print(json.dumps(result))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
