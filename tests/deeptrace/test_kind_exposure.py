"""Exposed communication per kind and per purpose of collective (issue 25 part 2), on planted traces whose answer
is known: report.json's `collective_kinds` / `collective_purposes`, and the same figures in the terminal and
Markdown reports.

Collector run, per step (ms from the step's start), every rank alike:

    compute  0..10 (forward), 18..22 (backward)
    fsdp param all_gather      5..15  → exposed 10..15   = 5 ms
    fsdp grad reduce_scatter  20..24  → exposed 22..24   = 2 ms
    ep dispatch all_to_all    30..33  → exposed            3 ms
    ep combine all_to_all     34..35  → exposed            1 ms
    hsdp replicate all_reduce 40..41  → exposed            1 ms, then compute 41..50 closes the step

Kineto trace, per step (µs): GEMM 0..100, AllGather kernel 50..150 (exposed 100..150 = 50), ReduceScatter kernel
200..260 and GEMM 250..300 (exposed 200..250 = 50).
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from deeptrace.cli import main
from deeptrace.collect import Collector
from deeptrace.spans import Category

from tests.deeptrace.kineto_builders import GEMM, KinetoTrace, write_ranks

MS = 1_000_000
STEPS = 3
MIB = 2**20
PLAN = (  # name, group, kind, purpose, start ms, end ms, exposed ms, bytes
    ("fsdp_param_all_gather", "fsdp", "all_gather", "fsdp_param_gather", 5, 15, 5.0, 8 * MIB),
    ("fsdp_grad_reduce_scatter", "fsdp", "reduce_scatter", "grad_reduce_scatter", 20, 24, 2.0, 4 * MIB),
    ("ep_dispatch_all_to_all", "ep", "all_to_all", "ep_dispatch", 30, 33, 3.0, 2 * MIB),
    ("ep_combine_all_to_all", "ep", "all_to_all", "ep_combine", 34, 35, 1.0, 2 * MIB),
    ("all_reduce", "hsdp_replicate", "all_reduce", "hsdp_all_reduce", 40, 41, 1.0, 1 * MIB),
)
STEP_MS = 50.0


def _collector_run(run_dir: Path, world_size: int = 2) -> Path:
    for rank in range(world_size):
        with Collector(run_dir, rank, world_size, heartbeat_interval_s=None) as collector:
            for step in range(STEPS):  # a step's window runs from its first span's start to its last one's end
                t0 = 10_000 * MS + step * 100 * MS
                for name, start, end in (("forward", 0, 10), ("backward", 18, 22), ("optimizer", 41, 50)):
                    collector.record(name, Category.COMPUTE, t0 + start * MS, t0 + end * MS, step=step,
                                     track="main/1")  # fmt: skip
                for seq, (name, group, _, _, start, end, _, nbytes) in enumerate(PLAN):
                    collector.record(name, Category.COMM, t0 + start * MS, t0 + end * MS, step=step, group=group,
                                     seq=step * len(PLAN) + seq, nbytes=nbytes, track="comm")  # fmt: skip
    return run_dir


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object], str]:
    run_dir = _collector_run(tmp_path_factory.mktemp("kinds"))
    result = CliRunner().invoke(main, ["analyze", str(run_dir), "-j", "1", "--no-png"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    report = json.loads((run_dir / "deeptrace" / "report.json").read_text())
    return run_dir, report, result.output


def test_collector_exposure_per_kind_and_purpose(analysed: tuple[Path, dict[str, object], str]) -> None:
    _, report, _ = analysed
    ranks = report["ranks"]
    assert isinstance(ranks, dict)
    for rank in ("0", "1"):
        kinds, purposes = ranks[rank]["collective_kinds"], ranks[rank]["collective_purposes"]
        expected_kind: dict[str, float] = {}
        for _, _, kind, purpose, start, end, exposed, nbytes in PLAN:
            expected_kind[kind] = expected_kind.get(kind, 0.0) + exposed
            got = purposes[purpose]
            assert got["exposed_ms_per_step"] == pytest.approx(exposed)
            assert got["exposed_pct_of_step"] == pytest.approx(100 * exposed / STEP_MS, abs=0.01)
            assert got["count"] == STEPS and got["bytes"] == STEPS * nbytes
            assert got["total_ms"] == pytest.approx(STEPS * (end - start))
        assert set(kinds) == set(expected_kind)
        for kind, exposed in expected_kind.items():
            assert kinds[kind]["exposed_ms_per_step"] == pytest.approx(exposed), kind
            assert kinds[kind]["exposed_pct_of_step"] == pytest.approx(100 * exposed / STEP_MS, abs=0.01)


def test_terminal_and_markdown_show_exposure_per_kind_and_purpose(
    analysed: tuple[Path, dict[str, object], str],
) -> None:
    run_dir, _, printed = analysed
    markdown = (run_dir / "deeptrace" / "report.md").read_text()
    assert "Exposed communication per kind of collective" in printed
    assert "Exposed communication per purpose of collective" in printed
    rows = {line.split()[1]: line for line in printed.splitlines() if line.startswith("│ ") and len(line.split()) > 2}
    assert "5.00" in rows["all_gather"] and "10.0%" in rows["all_gather"]  # 5 ms of a 50 ms step
    assert "4.00" in rows["all_to_all"] and "8.0%" in rows["all_to_all"]
    assert "3.00" in rows["ep_dispatch"] and "6.0%" in rows["ep_dispatch"]
    assert "| all_gather | 2 | 3.0 | 24.0 MiB | 5.00 | 10.0% | 5.00 (rank 0) |" in markdown
    assert "| hsdp_all_reduce | 2 | 3.0 | 3.0 MiB | 1.00 | 2.0% | 1.00 (rank 0) |" in markdown
    assert "| 1 | grad_reduce_scatter | 3 | 12.0 MiB | 12.00 | 6.00 | 2.00 | 4.00% |" in markdown


def test_kineto_exposure_per_kind(tmp_path: Path) -> None:
    trace = KinetoTrace(rank=0, world_size=1)
    for i in range(STEPS + 1):
        base = 1_000_000 + i * 1000
        trace.step(i, base, 500 if i < STEPS else 100)
        trace.kernel(GEMM, base, 100)
        trace.kernel("ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", base + 50, 100, stream=20)
        trace.kernel(GEMM, base + 250, 50)
        trace.kernel("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevComm*)", base + 200, 60, stream=20)
    write_ranks([trace], tmp_path / "traces")
    result = CliRunner().invoke(main, ["analyze", str(tmp_path / "traces"), "-j", "1", "--json"])
    assert result.exit_code == 0, result.output
    kinds = orjson.loads(result.stdout)["ranks"]["0"]["collective_kinds"]
    assert set(kinds) == {"all_gather", "reduce_scatter"}
    assert kinds["all_gather"]["exposed_ms_per_step"] == pytest.approx(0.050)  # 100..150 µs
    assert kinds["reduce_scatter"]["exposed_ms_per_step"] == pytest.approx(0.050)  # 200..250 µs
    assert kinds["all_gather"]["bytes"] is None  # Kineto's kernels carry no sizes here
