"""Collector spans: a blocking collective nested in a compute span is exposed communication, an asynchronous one
(on a lane track) overlaps the compute beside it."""

import pytest
from deeptrace.analysis.breakdown import rank_breakdown
from deeptrace.analysis.collectives import collective_log
from deeptrace.analysis.nesting import exclusive_nesting
from deeptrace.analysis.table import table_from_spans
from deeptrace.spans import Category, Span

MS = 1_000_000


def _spans() -> list[Span]:
    return [
        Span("forward", Category.COMPUTE, 0, 10 * MS, track="main", step=0),
        # blocking all_reduce inside forward: the thread waits 4..6 ms
        Span("all_reduce", Category.COMM, 4 * MS, 6 * MS, track="main/1", step=0, group="dp", seq=0),
        Span("attention", Category.COMPUTE, 1 * MS, 2 * MS, track="main/1", step=0),
        Span("softmax", Category.COMPUTE, 1 * MS, 1 * MS + MS // 2, track="main/2", step=0),
        # asynchronous all_gather begun at 8 ms, done at 14 ms, beside the thread's own spans
        Span("all_gather", Category.COMM, 8 * MS, 14 * MS, track="main/async-0", step=0, group="dp", seq=1),
    ]


def test_self_time_of_nested_spans() -> None:
    table = exclusive_nesting(table_from_spans(_spans(), rank=0, path="x"))
    result = rank_breakdown(table).overall
    # compute 0..4 and 6..10 (8 ms; the nested compute spans are inside it), comm 4..6 and 8..14 (8 ms),
    # overlap only where the asynchronous all_gather runs beside forward: 8..10 → 25 %
    assert result.compute_ms == pytest.approx(8.0)
    assert result.comm_ms == pytest.approx(8.0)
    assert result.overlap_pct == pytest.approx(25.0)
    assert result.exposed_comm_ms == pytest.approx(6.0)
    # without self time the blocking all_reduce would look hidden behind forward
    plain = rank_breakdown(table_from_spans(_spans(), rank=0, path="x")).overall
    assert plain.overlap_pct == pytest.approx(50.0)


def test_collectives_are_never_split() -> None:
    table = exclusive_nesting(table_from_spans(_spans(), rank=0, path="x"))
    log = collective_log(table)
    assert [k[3] for k in log.keys] == [0, 1]
    assert [e - s for s, e in zip(log.start_ns, log.end_ns, strict=True)] == [2 * MS, 6 * MS]
