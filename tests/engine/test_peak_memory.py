"""The CPU peak of ``xtrain.loss.peak_memory``: the profiler's allocation events read with their addresses, and the
running sum kept by address, so that a block freed on a thread the profiler does not see (gloo's worker dropping
an all-gather's output) leaves the sum when its address is allocated again instead of staying to the end."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile
from xtrain.loss.peak_memory import _allocation_events, measure_peak, running_peak


def test_the_events_carry_each_blocks_address_and_signed_size() -> None:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        a = torch.empty(1000, dtype=torch.float32)
        b = torch.empty(2000, dtype=torch.float32)
        del a, b
    events = _allocation_events(prof)
    allocated = {address: nbytes for address, nbytes in events if nbytes > 0}
    freed = {address: -nbytes for address, nbytes in events if nbytes < 0}
    assert sorted(allocated.values()) == [4000, 8000]
    assert freed == allocated  # every free names the block it frees


def test_a_block_allocated_again_at_a_held_address_counts_once() -> None:
    # The first block at 0x10 was freed where the profiler could not see it; the second takes its place.
    assert running_peak([(0x10, 4000), (0x10, 4000)]) == 4000
    # Held: 4000, 5000, then 3000 in place of 4000 (4000), then 4500; a plain sum would reach 8500.
    assert running_peak([(0x10, 4000), (0x20, 1000), (0x10, 3000), (0x30, 500)]) == 5000


def test_recorded_frees_and_frees_of_older_blocks_are_subtracted() -> None:
    assert running_peak([(0x10, 4000), (0x10, -4000), (0x20, 1000)]) == 4000
    # A block from before the profile (never allocated in it) freed, then a new one: the level went down first.
    assert running_peak([(0x10, 4000), (0x99, -3000), (0x20, 2000)]) == 4000
    assert running_peak([(0x10, 4000), (0x99, -3000), (0x20, 4000)]) == 5000


def test_the_measured_peak_of_a_call_is_its_largest_live_set() -> None:
    def step() -> None:
        a = torch.empty(250_000)  # 1 MB
        b = torch.empty(500_000)  # 2 MB: 3 MB live
        del a
        c = torch.empty(125_000)  # 0.5 MB: 2.5 MB live
        del b, c

    _, peak = measure_peak(step)
    assert peak == 3_000_000
