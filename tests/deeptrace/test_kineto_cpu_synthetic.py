"""CPU-only Kineto traces with planted times: compute, communication and waiting by the documented rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from deeptrace.analysis.breakdown import rank_breakdown
from deeptrace.analysis.rank import RankJob, analyse_rank
from deeptrace.analysis.run import analyse_run
from deeptrace.classify import ClassifyConfig
from deeptrace.kineto import read_kineto

from tests.deeptrace.kineto_builders import KinetoTrace


def _cpu_trace() -> KinetoTrace:
    t = KinetoTrace(rank=0, world_size=2)
    t.step(5, 0, 1000)
    return t


def test_collective_fully_hidden_under_compute(tmp_path: Path) -> None:
    t = _cpu_trace()
    t.cpu("aten::mm", 100, 400)
    t.cpu("aten::empty", 120, 5)  # nested in the mm: changes nothing
    t.gloo("all_reduce", 200, 100)
    figures = rank_breakdown(read_kineto(t.write(tmp_path / "hidden.json"))).overall
    assert figures.overlap_pct == 100.0
    assert figures.comm_ms == pytest.approx(0.1) and figures.exposed_comm_ms == 0.0
    assert figures.compute_ms == pytest.approx(0.4)


def test_collective_fully_exposed_while_the_thread_waits_inside_an_operator(tmp_path: Path) -> None:
    t = _cpu_trace()
    # A backward hook issues a reduce-scatter, blocks in Work.wait() (no operator recorded), then copies the result.
    t.cpu("autograd::engine::evaluate_function: RegisterPostBackwardFunctionBackward", 100, 500)
    t.cpu("FSDP::post_backward_reduce (layers.0)", 150, 400, cat="user_annotation")
    t.cpu("aten::cat", 160, 20)
    t.cpu("c10d::_reduce_scatter_base_", 200, 10)
    t.gloo("all_reduce", 205, 250)
    t.cpu("aten::copy_", 480, 30)
    figures = rank_breakdown(read_kineto(t.write(tmp_path / "exposed.json"))).overall
    assert figures.overlap_pct == 0.0
    assert figures.exposed_comm_ms == pytest.approx(0.25)
    # compute: 100..200 (hook, cat) + 480..510 (copy) + 550..600 (after the scope); waiting 200..480 and 510..550.
    assert figures.compute_ms == pytest.approx(0.1 + 0.03 + 0.05)


def test_wait_operator_is_not_compute(tmp_path: Path) -> None:
    t = _cpu_trace()
    t.cpu("aten::mm", 0, 500)
    t.cpu("c10d::allreduce_", 500, 10)
    t.cpu("_c10d_functional::wait_tensor", 600, 200)
    t.gloo("all_reduce", 400, 400)  # 100 us under the mm, then 300 us exposed
    figures = rank_breakdown(read_kineto(t.write(tmp_path / "wait.json"))).overall
    assert figures.overlap_pct == pytest.approx(25.0)
    assert figures.exposed_comm_ms == pytest.approx(0.3)
    assert figures.compute_ms == pytest.approx(0.5)


def test_no_collective_gives_no_overlap(tmp_path: Path) -> None:
    t = _cpu_trace()
    t.cpu("aten::mm", 100, 400)
    path = t.write(tmp_path / "rank-0.json")
    result = analyse_rank(RankJob(str(path), "kineto", ClassifyConfig()))
    assert result.timing == "cpu" and result.breakdown.overall.overlap_pct is None
    assert result.breakdown.overall.compute_ms == pytest.approx(0.4)
    warnings = analyse_run(tmp_path, jobs=1).warnings
    assert any("no communication kernel" in w for w in warnings)


def test_only_the_main_thread_computes(tmp_path: Path) -> None:
    t = _cpu_trace()
    t.cpu("aten::mm", 100, 100)
    t.gloo("all_gather", 300, 200)
    t.cpu("aten::copy_", 350, 100, tid=9)  # gloo's own copy inside its collective: part of the collective
    figures = rank_breakdown(read_kineto(t.write(tmp_path / "threads.json"))).overall
    assert figures.compute_ms == pytest.approx(0.1) and figures.overlap_pct == 0.0
