"""PyTorch Flight Recorder dumps: the process group's own record of its last collectives, per rank.

With TORCH_FR_BUFFER_SIZE=N every process group keeps a ring of its last N collectives (NCCL; gloo too, as
torch 2.13 here does): per entry the process group, its per-group sequence number (`collective_seq_id`), the operation
(`profiling_name`, e.g. `gloo:all_reduce`), tensor sizes, state (scheduled, started, completed) and the Python
frames that issued it. On a timeout (or asked, `torch._C._distributed_c10d._dump_fr_trace()`) it is written as
a pickle of plain dicts, lists, tuples, strings and numbers. deeptrace reads it without torch, with an unpickler
that refuses every class: a dump is data, never code.

The finding: per process group, the first sequence number at which ranks disagree: a rank that never issued it
(its last sequence number is lower: the rank the others wait for), another operation, or other tensor sizes.
"""

from __future__ import annotations

import io
import pickle
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deeptrace.errors import TraceInputError
from deeptrace.rundir import layout


class _DataOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing {module}.{name}: a Flight Recorder dump holds only plain data")


def read_dump(path: Path) -> dict[str, Any]:
    try:
        obj = _DataOnly(io.BytesIO(path.read_bytes())).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as error:
        raise TraceInputError(path, f"not a Flight Recorder dump ({error})") from None
    except OSError as error:
        raise TraceInputError(path, f"cannot read: {error.strerror}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("entries"), list):
        raise TraceInputError(path, "not a Flight Recorder dump (no 'entries' list)")
    return obj


@dataclass(frozen=True)
class Entry:
    group: str
    seq: int
    op: str
    sizes: str
    state: str
    frames: list[str]

    def text(self) -> str:
        return f"{self.op} {self.sizes} ({self.state})"


def _entries(dump: dict[str, Any]) -> dict[str, dict[int, Entry]]:
    """Per process group (its name and description), the collectives by sequence number (p2p left out)."""
    groups: dict[str, dict[int, Entry]] = {}
    for raw in dump["entries"]:
        if not isinstance(raw, dict) or raw.get("is_p2p"):
            continue
        pg = raw.get("process_group")
        group = "/".join(str(part) for part in pg) if isinstance(pg, (tuple, list)) else str(raw.get("pg_id"))
        seq = raw.get("collective_seq_id")
        if not isinstance(seq, int):
            continue
        frames = [f"{f.get('name')} ({f.get('filename')}:{f.get('line')})" for f in raw.get("frames") or []
                  if isinstance(f, dict)]  # fmt: skip
        groups.setdefault(group, {})[seq] = Entry(
            group, seq, str(raw.get("profiling_name")), str(raw.get("input_sizes")), str(raw.get("state")), frames
        )
    return groups


def analyse_flight_recorder(run_dir: Path, warn: Any) -> dict[str, Any] | None:
    """report.json's `flight_recorder` section, or None without dumps."""
    paths = layout.flight_recorder_dumps(run_dir)
    if not paths:
        return None
    per_rank: dict[int, dict[str, dict[int, Entry]]] = {}
    for rank, path in paths.items():
        try:
            per_rank[rank] = _entries(read_dump(path))
        except TraceInputError as error:
            warn(str(error))
    disagreements = []
    for group in sorted({g for groups in per_rank.values() for g in groups}):
        found = _first_disagreement(group, {r: groups.get(group, {}) for r, groups in per_rank.items()})
        if found is not None:
            disagreements.append(found)
    first = min(disagreements, key=lambda d: d["seq"], default=None)
    if first is None:
        summary = f"the dumps of ranks {sorted(per_rank)} agree: every rank issued the same collectives"
    else:
        summary = (
            f"Flight Recorder: first disagreement in group {first['group']} at seq {first['seq']}: {first['summary']}"
        )
    return {
        "ranks": sorted(per_rank),
        "paths": {str(r): str(p) for r, p in paths.items()},
        "first_disagreement": first,
        "disagreements": disagreements,
        "summary": summary,
    }


def _first_disagreement(group: str, ranks: dict[int, dict[int, Entry]]) -> dict[str, Any] | None:
    last = {r: max(entries, default=-1) for r, entries in ranks.items()}
    # The ring buffer forgets old entries: only sequence numbers every rank could still have are compared.
    start = max((min(entries) for entries in ranks.values() if entries), default=0)
    for seq in range(start, max(last.values(), default=-1) + 1):
        present = {r: entries[seq] for r, entries in ranks.items() if seq in entries}
        absent = sorted(r for r in ranks if seq not in ranks[r])
        kinds = Counter(e.op + " " + e.sizes for e in present.values())
        if not absent and len(kinds) <= 1:
            continue
        majority = kinds.most_common(1)[0][0] if kinds else ""
        odd = sorted(r for r, e in present.items() if e.op + " " + e.sizes != majority)
        per_rank = {str(r): e.text() for r, e in sorted(present.items())}
        per_rank.update({str(r): f"never issued it (its last seq in this group: {last[r]})" for r in absent})
        if absent:
            what = (f"ranks {absent} never issued {majority.split(' ')[0]} #{seq}, which ranks "
                    f"{sorted(present)} wait in")  # fmt: skip
            kind = "missing"
        else:
            what = f"ranks {odd} issued another operation or other sizes than the rest ({majority})"
            kind = "mismatch"
        culprits = absent or odd
        frames = next(iter(present.values())).frames if present else []
        # Where the program issued it: the innermost frame outside installed packages (torch's own are not news).
        issued_at = next((f for f in frames if "-packages/" not in f), frames[0] if frames else None)
        return {
            "group": group,
            "seq": seq,
            "kind": kind,
            "culprit_ranks": culprits,
            "per_rank": per_rank,
            "issued_at": issued_at,
            "summary": what,
        }
    return None
