"""The convention of bytes a rank sends (xtrain.parallel.comm_volume), which the planner and the measurement
share: the ring figures in all, split by the node of each destination."""

from __future__ import annotations

from xtrain.parallel.comm_volume import (
    LinkBytes,
    all_gather_bytes,
    all_reduce_bytes,
    all_to_all_bytes,
    reduce_scatter_bytes,
)


def test_one_node_gets_the_ring_figures() -> None:
    group = [0, 1, 2, 3]
    assert all_gather_bytes(100, group, 1, 8) == LinkBytes(300, 0)  # (n - 1) · shard
    assert reduce_scatter_bytes(400, group, 1, 8) == LinkBytes(300, 0)  # (n - 1) / n · input
    assert all_reduce_bytes(400, group, 1, 8) == LinkBytes(600, 0)  # 2 (n - 1) / n · size


def test_bytes_are_split_by_the_destination_s_node() -> None:
    group = [0, 1, 2, 3]  # two nodes of two
    assert all_gather_bytes(100, group, 0, 2) == LinkBytes(100, 200)
    assert reduce_scatter_bytes(400, group, 3, 2) == LinkBytes(100, 200)
    assert all_reduce_bytes(400, group, 2, 2) == LinkBytes(200, 400)
    assert all_reduce_bytes(400, [1, 3], 1, 2) == LinkBytes(0, 400)  # replicas on two nodes


def test_all_to_all_counts_what_goes_to_other_ranks() -> None:
    assert all_to_all_bytes([10, 20, 30, 40], [4, 5, 6, 7], 5, 2) == LinkBytes(10, 70)  # 20 stay on rank 5
    assert all_to_all_bytes([10, 20], [0, 1], 0, 2) == LinkBytes(20, 0)


def test_a_group_of_one_sends_nothing() -> None:
    for count in (all_gather_bytes, reduce_scatter_bytes, all_reduce_bytes):
        assert count(1000, [3], 3, 2) == LinkBytes(0, 0)
    assert all_to_all_bytes([1000], [3], 3, 2) == LinkBytes(0, 0)
