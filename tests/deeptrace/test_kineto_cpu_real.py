"""A real CPU-only trace (xtrain, FSDP2 on 2 CPU processes with gloo; tests/deeptrace/data/README.md) against an
independent reference computed here from the raw events with plain Python intervals."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest
from deeptrace.analysis.run import RunAnalysis, analyse_run

DATA = Path(__file__).parent / "data"
FIXTURES = {rank: DATA / f"gloo-fsdp2-cpu-rank-{rank}.json.gz" for rank in (0, 1)}
COLLECTIVE_OP = re.compile(r"^(c10d::|_?c10d_functional::)")

Intervals = list[tuple[int, int]]


# --- a plain interval toolkit, independent of deeptrace.analysis.intervals ---------------------------------------
def merge(intervals: Intervals) -> Intervals:
    out: Intervals = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def length(intervals: Intervals) -> int:
    return sum(e - s for s, e in intervals)


def intersect(a: Intervals, b: Intervals) -> Intervals:
    return merge([(max(s, t), min(e, u)) for s, e in a for t, u in b if max(s, t) < min(e, u)])


def subtract(a: Intervals, b: Intervals) -> Intervals:
    out: Intervals = []
    for s, e in a:
        cursor = s
        for t, u in b:  # b is merged, so sorted
            if u <= cursor or t >= e:
                continue
            if t > cursor:
                out.append((cursor, t))
            cursor = max(cursor, u)
        if cursor < e:
            out.append((cursor, e))
    return out


# --- the documented rule, written out directly ---------------------------------------------------------------------
def reference(path: Path) -> dict[str, float]:
    events = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    ns = [(e, round(e["ts"] * 1000), round(e["ts"] * 1000) + round(e["dur"] * 1000)) for e in events]
    main_tid = next(e["tid"] for e in events if e["name"].startswith("ProfilerStep"))
    comm = merge([(s, t) for e, s, t in ns if e["name"].startswith("gloo:")])
    main = [(e, s, t) for e, s, t in ns if e["tid"] == main_tid and not e["name"].startswith("ProfilerStep")]
    ops = [(e, s, t) for e, s, t in main if e["cat"] == "cpu_op"]
    waiting = [(s, t) for e, s, t in ops if COLLECTIVE_OP.match(e["name"])]
    for op, s, t in ops:
        if not COLLECTIVE_OP.match(op["name"]):
            continue
        # Its scope: the shortest main-thread event that contains it (if that is a collective op too, the outer
        # collective op's scope already covers this one).
        around = [(ps, pt, p) for p, ps, pt in main if ps <= s and t <= pt and p is not op]
        if not around:
            continue
        ps, pt, parent = min(around, key=lambda x: x[1] - x[0])
        if COLLECTIVE_OP.match(parent["name"]):
            continue
        inside = [
            (a, b) for e, a, b in ops if ps <= a and b <= pt and e is not parent and not COLLECTIVE_OP.match(e["name"])
        ]
        waiting += subtract([(s, pt)], merge(inside))
    compute = subtract(merge([(s, t) for _, s, t in ops]), merge(waiting))
    hidden = length(intersect(comm, compute))
    return {
        "comm_ms": length(comm) / 1e6,
        "compute_ms": length(compute) / 1e6,
        "exposed_comm_ms": (length(comm) - hidden) / 1e6,
        "overlap_pct": 100 * hidden / length(comm),
    }


@pytest.fixture(scope="module")
def analysis(tmp_path_factory: pytest.TempPathFactory) -> RunAnalysis:
    folder = tmp_path_factory.mktemp("cpu-traces")
    for path in FIXTURES.values():
        shutil.copy(path, folder / path.name)
    return analyse_run(folder, jobs=1)


@pytest.mark.parametrize("rank", [0, 1])
def test_figures_match_an_independent_reference(analysis: RunAnalysis, rank: int) -> None:
    result = analysis.ranks[rank]
    assert result.timing == "cpu" and [s.step for s in result.breakdown.steps] == [2]
    got = result.breakdown
    expected = reference(FIXTURES[rank])
    (step,) = got.steps
    for figures in (got.overall, step):
        assert figures.comm_ms == pytest.approx(expected["comm_ms"], abs=1e-6)
        assert figures.compute_ms == pytest.approx(expected["compute_ms"], abs=1e-6)
        assert figures.exposed_comm_ms == pytest.approx(expected["exposed_comm_ms"], abs=1e-6)
        assert figures.overlap_pct == pytest.approx(expected["overlap_pct"], abs=1e-6)
    # FSDP2 on CPU waits for each collective: a little communication hides under compute, most is exposed.
    assert 0 < expected["overlap_pct"] < 5 and expected["exposed_comm_ms"] > 50
    assert "gloo collectives" in (result.timing_note or "")


def test_gloo_collectives_match_across_ranks_by_order(analysis: RunAnalysis) -> None:
    assert sorted(analysis.ranks) == [0, 1]
    # 24 all-gathers and 17 gloo all-reduces (12 of them FSDP2's reduce-scatters, 5 the gradient norm's and the
    # loss's) in the step, on both ranks.
    assert analysis.matched_by == {"seq": 0, "order": 41}
    groups = {label["group"] for label in analysis.skew.labels}
    assert groups == {"gloo:all_gather", "gloo:reduce_scatter", "gloo:all_reduce"}
    # Both ranks ran on one host: the clocks agree, so matched collectives end together (offset well under 1 ms).
    assert abs(analysis.offsets_ns[1]) < 1_000_000
    assert not any("could not be matched" in w for w in analysis.warnings)


def test_reduce_scatters_that_gloo_runs_as_all_reduces_count_as_reduce_scatters(analysis: RunAnalysis) -> None:
    """gloo runs FSDP2's reduce_scatter_tensor as an all-reduce (`c10d::_reduce_scatter_base_` issues a
    `gloo:all_reduce`): the per-kind exposure counts it as the reduce-scatter it is."""
    for result in analysis.ranks.values():
        assert result.kinds is not None
        counts = {kind: figures.count for kind, figures in result.kinds.kinds.items()}
        assert counts == {"all_gather": 24, "reduce_scatter": 12, "all_reduce": 5}
        assert result.kinds.kinds["reduce_scatter"].exposed_ns > 0
