"""The sweep-line primitives against a brute-force count on an integer grid."""

import numpy as np
from deeptrace.analysis import intervals as iv
from hypothesis import given, settings
from hypothesis import strategies as st

spans = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 40)), max_size=25)


def _arrays(pairs: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    s = np.array([a for a, _ in pairs], dtype=np.int64)
    return s, s + np.array([d for _, d in pairs], dtype=np.int64)


def _grid(pairs: list[tuple[int, int]]) -> np.ndarray:
    covered = np.zeros(260, dtype=bool)
    for a, d in pairs:
        covered[a : a + d] = True
    return covered


@settings(max_examples=200, deadline=None)
@given(spans, spans)
def test_union_and_intersection_match_brute_force(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> None:
    ma, mb = iv.merge(*_arrays(a)), iv.merge(*_arrays(b))
    assert iv.total(ma) == _grid(a).sum()
    assert iv.intersection(ma, mb) == (_grid(a) & _grid(b)).sum()
    assert iv.total(iv.union(ma, mb)) == (_grid(a) | _grid(b)).sum()
    assert iv.total(iv.difference(ma, mb)) == (_grid(a) & ~_grid(b)).sum()
    # merged sets are sorted and disjoint
    assert np.all(ma[0][1:] > ma[1][:-1])


def test_touching_intervals_merge_like_hta() -> None:
    s, e = iv.merge(np.array([0, 10, 30], np.int64), np.array([10, 20, 40], np.int64))
    assert s.tolist() == [0, 30] and e.tolist() == [20, 40]


def test_coarsen_joins_small_gaps_only() -> None:
    merged = (np.array([0, 12, 100], np.int64), np.array([10, 20, 110], np.int64))
    s, e = iv.coarsen(merged, 5)
    assert s.tolist() == [0, 100] and e.tolist() == [20, 110]


def test_difference_keeps_what_the_second_set_does_not_cover() -> None:
    a = (np.array([0, 20, 50], np.int64), np.array([10, 40, 60], np.int64))
    b = (np.array([5, 40], np.int64), np.array([25, 55], np.int64))
    s, e = iv.difference(a, b)
    assert list(zip(s.tolist(), e.tolist(), strict=True)) == [(0, 5), (25, 40), (55, 60)]
    assert iv.difference(a, (np.empty(0, np.int64), np.empty(0, np.int64)))[0].tolist() == [0, 20, 50]
