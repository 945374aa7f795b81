"""Per-rank breakdown and overlap on a synthetic trace whose figures are known from its plan."""

from pathlib import Path

import pytest
from deeptrace.analysis.breakdown import rank_breakdown
from deeptrace.analysis.run import analyse_run
from deeptrace.kineto import read_kineto

from tests.deeptrace.kineto_builders import GEMM, KinetoTrace, known_overlap_trace


def test_known_overlap_and_breakdown(tmp_path: Path) -> None:
    table = read_kineto(known_overlap_trace().write(tmp_path / "rank-0.json"))
    result = rank_breakdown(table)
    assert [s.step for s in result.steps] == [10, 11]  # step 12 is the cut-short last one
    for step in result.steps:
        assert step.window_ms == pytest.approx(0.200)
        assert step.overlap_pct == pytest.approx(50.0)
        assert step.comm_ms == pytest.approx(0.100)
        assert step.exposed_comm_ms == pytest.approx(0.050)
        assert step.compute_ms == pytest.approx(0.120)  # 0..50, 100..160, 190..200
        assert step.memory_ms == pytest.approx(0.010)
        assert step.idle_ms == pytest.approx(0.200 - 0.120 - 0.050 - 0.010)
    assert result.exposed_comm_ms_per_step == pytest.approx(0.050)
    assert result.overall.overlap_pct == pytest.approx(50.0)
    # parts partition the window
    o = result.overall
    assert o.compute_ms + o.exposed_comm_ms + o.memory_ms + o.other_ms + o.idle_ms == pytest.approx(o.window_ms)


def test_overlap_counts_compute_on_any_stream_once(tmp_path: Path) -> None:
    t = KinetoTrace()
    t.kernel("ncclKernel_AllGather_RING_LL_Sum_bf16", 0, 100, stream=20)
    t.kernel(GEMM, 10, 30, stream=7)
    t.kernel(GEMM, 20, 40, stream=8)  # overlaps the first compute kernel: the union 10..60 counts, not 70
    table = read_kineto(t.write(tmp_path / "rank-0.json"))
    assert rank_breakdown(table).overall.overlap_pct == pytest.approx(50.0)


def test_no_communication_kernel_is_said_not_reported_as_zero(tmp_path: Path) -> None:
    t = KinetoTrace()
    t.kernel(GEMM, 0, 100)
    t.write(tmp_path / "rank-0.json")
    analysis = analyse_run(tmp_path, jobs=1)
    assert analysis.ranks[0].breakdown.overall.overlap_pct is None
    assert any("no communication kernel" in w for w in analysis.warnings)


def test_unclassified_kernels_are_counted_and_reported(tmp_path: Path) -> None:
    t = KinetoTrace()
    t.kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 0, 100, stream=20)
    t.kernel("custom_allreduce_kernel<half>", 0, 50)
    t.kernel("custom_allreduce_kernel<half>", 60, 10)
    t.write(tmp_path / "rank-0.json")
    analysis = analyse_run(tmp_path, jobs=1)
    result = analysis.ranks[0]
    assert result.kernel_counts["other"] == 2
    assert result.unclassified == {"custom_allreduce_kernel<half>": 2}
    assert any("2 kernels matched no classification pattern" in w for w in analysis.warnings)
    assert result.breakdown.overall.other_ms == pytest.approx(0.0)  # hidden under communication
