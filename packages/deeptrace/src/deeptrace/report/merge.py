"""merged_trace.json: one Chrome/Perfetto trace of all ranks, one process per rank, clocks corrected.

Written incrementally (one rank at a time), so the file can be larger than memory. Times are microseconds since
the earliest corrected event; `otherData.origin_unix_ns` gives that origin as wall time.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from deeptrace.analysis.rank import RankResult
from deeptrace.analysis.table import CATEGORIES


def write_merged_trace(ranks: dict[int, RankResult], offsets_ns: dict[int, int], path: Path) -> int:
    """Write the merged trace; returns the number of interval events written."""
    origin = min(
        (int(r.merge_rows.start_ns.min()) - offsets_ns.get(k, 0) for k, r in ranks.items()
         if r.merge_rows is not None and r.merge_rows.start_ns.size),
        default=0,
    )  # fmt: skip
    count = 0
    with path.open("wb") as out:
        # "otherData" is the Chrome trace format's place for metadata; viewers ignore it.
        out.write(b'{"displayTimeUnit": "ms", "otherData": ')
        out.write(
            orjson.dumps({"origin_unix_ns": origin, "clock_offsets_ns": {str(k): v for k, v in offsets_ns.items()}})
        )
        out.write(b', "traceEvents": [\n')
        first = True
        for rank, result in ranks.items():
            rows = result.merge_rows
            if rows is None:
                continue
            head: list[dict[str, object]] = [
                {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
                {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
            ]
            head += [
                {"ph": "M", "name": "thread_name", "pid": rank, "tid": i + 1, "args": {"name": name}}
                for i, name in enumerate(rows.tracks)
            ]
            shift = offsets_ns.get(rank, 0) + origin
            starts = ((rows.start_ns - shift) / 1000.0).tolist()
            durs = ((rows.end_ns - rows.start_ns) / 1000.0).tolist()
            batch: list[bytes] = [orjson.dumps(h) for h in head]
            for ts, dur, cat, track, name in zip(
                starts, durs, rows.category.tolist(), rows.track.tolist(), rows.name_id.tolist(), strict=True
            ):
                batch.append(
                    orjson.dumps(
                        {
                            "ph": "X",
                            "name": rows.names[name],
                            "cat": CATEGORIES[cat].value,
                            "pid": rank,
                            "tid": track + 1,
                            "ts": round(ts, 3),
                            "dur": round(dur, 3),
                        }
                    )
                )
                if len(batch) >= 10000:
                    out.write((b"" if first else b",\n") + b",\n".join(batch))
                    first = False
                    count += len(batch)
                    batch = []
            if batch:
                out.write((b"" if first else b",\n") + b",\n".join(batch))
                first = False
                count += len(batch)
        out.write(b"\n]}\n")
    return count
