"""Kineto trace → RankTable: rank, steps mapped through the launching CPU call, HTA's window, NCCL metadata."""

from pathlib import Path

import numpy as np
import pytest
from deeptrace.analysis.table import CODE
from deeptrace.errors import TraceInputError
from deeptrace.kineto import read_kineto
from deeptrace.spans import Category

from tests.deeptrace.kineto_builders import GEMM, NCCL_ALLREDUCE, KinetoTrace, allreduce_ranks


def test_rank_and_world_from_distributed_info(tmp_path: Path) -> None:
    path = KinetoTrace(rank=5, world_size=8).write(tmp_path / "whatever.json")
    table = read_kineto(path)
    assert (table.rank, table.world_size) == (5, 8)
    assert not any("taken from the file name" in w for w in table.warnings)


def test_rank_from_file_name_with_warning(tmp_path: Path) -> None:
    t = KinetoTrace(rank=None)
    t.kernel(GEMM, 10, 5)
    table = read_kineto(t.write(tmp_path / "trainer_rank-3.pt.trace.json.gz"))
    assert table.rank == 3
    assert any("rank 3 taken from the file name" in w for w in table.warnings)


def test_no_rank_at_all_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(TraceInputError, match="cannot tell the rank"):
        read_kineto(KinetoTrace(rank=None).write(tmp_path / "trace.json"))


def test_chrome_trace_of_another_tool_is_refused(tmp_path: Path) -> None:
    t = KinetoTrace(markers=False)
    t.kernel(GEMM, 10, 5)
    with pytest.raises(TraceInputError, match="without Kineto's markers"):
        read_kineto(t.write(tmp_path / "chrome.json"))


def test_step_of_a_kernel_is_the_step_of_its_launch(tmp_path: Path) -> None:
    t = KinetoTrace()
    t.step(1, 0, 100)
    t.step(2, 100, 100)
    t.step(3, 200, 100)
    t.kernel(GEMM, 150, 30, launch_us=90)  # launched in step 1, runs during step 2's CPU window
    t.kernel(GEMM, 160, 5, launch_us=120)
    t.kernel(GEMM, 250, 5, launch_us=210)  # step 3: the last, cut by the profiler → outside HTA's window
    table = read_kineto(t.write(tmp_path / "rank-0.json"))
    assert table.step.tolist() == [1, 2, 3]
    assert table.in_window.tolist() == [True, True, False]
    assert table.complete_steps == [1, 2]


def test_nccl_metadata_gives_group_and_sequence(tmp_path: Path) -> None:
    (trace,) = allreduce_ranks(1, steps=1, per_step=3)
    table = read_kineto(trace.write(tmp_path / "rank-0.json"))
    comm = table.category == CODE[Category.COMM]
    assert table.seq[comm].tolist() == [0, 1, 2]
    assert {table.groups[g] for g in table.group_id[comm]} == {"pg 0"}
    assert np.all(table.group_id[~comm] == -1)
    assert table.names[table.name_id[comm][0]] == NCCL_ALLREDUCE


def test_real_trace_counts(shared_data: Path) -> None:
    table = read_kineto(shared_data / "kineto-single" / "rank-0.json.gz")
    counts = {c: int((table.category == CODE[c]).sum()) for c in (Category.COMM, Category.COMPUTE, Category.MEMORY)}
    assert counts == {Category.COMM: 21, Category.COMPUTE: 2679, Category.MEMORY: 1074}
    assert table.rank == 0 and table.world_size == 2
    assert table.complete_steps == [4, 5]  # ProfilerStep#6 is the last one, left out like HTA does
