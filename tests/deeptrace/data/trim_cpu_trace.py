"""Trim a CPU-only Kineto trace to one ProfilerStep (see README.md): `python trim_cpu_trace.py SRC DST STEP`."""

import gzip
import json
import sys
from pathlib import Path

KEPT_FIELDS = ("ph", "cat", "name", "pid", "tid", "ts", "dur")
KEPT_METADATA = ("schemaVersion", "deviceProperties", "distributedInfo", "baseTimeNanoseconds")


def trim(src: Path, dst: Path, step: int) -> None:
    doc = json.loads(src.read_text())
    events = doc["traceEvents"]
    window = next(e for e in events if e.get("name") == f"ProfilerStep#{step}")
    lo, hi = window["ts"], window["ts"] + window["dur"]
    kept = [e for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"]
    kept += [
        {k: e[k] for k in KEPT_FIELDS}
        for e in events
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation") and lo <= e["ts"] < hi
    ]
    out = {k: doc[k] for k in KEPT_METADATA} | {"traceEvents": kept}
    dst.write_bytes(gzip.compress(json.dumps(out, separators=(",", ":")).encode(), compresslevel=9))


if __name__ == "__main__":
    trim(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
