"""`make bench`: every benchmark in tools/bench/ in turn, each in its own process, then their wall times.

Each benchmark's output goes to the terminal as it runs; at the end a table gives each one's wall time, exit code
and whether it stayed within the 10 minutes a default run may take on the 2-core development machine, and one
JSON line gives the same (``{"benchmarks": [{"name", "wall_s", "rc", "within_limit"}], "total_s"}``).

Usage: python tools/run_benchmarks.py [NAME ...]   (names without .py; default: all of tools/bench/)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).parent / "bench"
LIMIT_S = 600.0


def main() -> int:
    wanted = set(sys.argv[1:])
    scripts = sorted(path for path in BENCH.glob("*.py") if not wanted or path.stem in wanted)
    unknown = wanted - {path.stem for path in scripts}
    if unknown:
        print(f"no benchmark named {', '.join(sorted(unknown))} in {BENCH}", file=sys.stderr)
        return 2
    rows: list[dict[str, object]] = []
    started = time.perf_counter()
    for script in scripts:
        print(f"== {script.relative_to(BENCH.parent.parent)}", flush=True)
        start = time.perf_counter()
        rc = subprocess.call([sys.executable, str(script)])
        wall = time.perf_counter() - start
        rows.append({"name": script.stem, "wall_s": round(wall, 1), "rc": rc, "within_limit": wall <= LIMIT_S})
    width = max(len(str(row["name"])) for row in rows) if rows else 4
    print(f"\n{'benchmark'.ljust(width)}  {'wall':>8}  rc  within {LIMIT_S / 60:.0f} min")
    for row in rows:
        within = "yes" if row["within_limit"] else "NO"
        print(f"{str(row['name']).ljust(width)}  {row['wall_s']:>7}s  {row['rc']:>2}  {within}")
    print(json.dumps({"benchmarks": rows, "total_s": round(time.perf_counter() - started, 1)}))
    return 1 if any(row["rc"] != 0 for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
