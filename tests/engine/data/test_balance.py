"""Data-parallel balance (xtrain.data.balance) through the stream the trainer uses: every document still used
exactly once per epoch, the same packs for the same seed, micro-steps far more even than in stream order, and a
data position that resumes exactly, also mid-window and on another number of processes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from xtrain.data import PackStream
from xtrain.data.balance import pack_cost, plan_window
from xtrain.data.packing import Balance, Pack, Piece
from xtrain.errors import DataError

from .corpora import synthetic_corpus
from .test_packing import check_pack_shape, check_pieces_hold_their_documents

PACK = 256


def _lengths(count: int, seed: int) -> list[int]:
    """Heavy-tailed: lognormal, some documents a whole pack long and some longer (cut into pieces)."""
    generator = np.random.default_rng(seed)
    lengths = np.clip(generator.lognormal(3.0, 1.2, size=count), 1, 3 * PACK).astype(int)
    lengths[generator.random(count) < 0.03] = PACK
    return [int(n) for n in lengths]


CORPUS = synthetic_corpus([_lengths(3000, 1), _lengths(1000, 2)], weights=[2.0, 1.0])


def _stream(dp: int, *, seed: int = 0, window: int = 3, global_batch: int = 8) -> PackStream:
    return PackStream(CORPUS, PACK, seed=seed, lookahead=16, balance=Balance(window, global_batch, dp))


def _key(piece: Piece) -> tuple[int, int, int, int]:
    return (piece.source, piece.document, piece.epoch, piece.start)


def _imbalance(steps: list[list[Pack]], dp: int) -> float:
    """Mean over micro-steps of max/mean attention cost over the ranks (rank r's micro-step j: r × micro + j)."""
    figures = []
    for packs in steps:
        costs = np.asarray([pack_cost(pack.pieces) for pack in packs], dtype=float).reshape(dp, -1)
        figures += [column.max() / column.mean() for column in costs.T]
    return float(np.mean(figures))


def test_every_piece_of_an_epoch_is_used_exactly_once() -> None:
    stream = _stream(dp=4)
    used: Counter[tuple[int, int, int, int]] = Counter()
    expected = {(s, d, 0) for s, source in enumerate(CORPUS.sources) for d in range(source.num_documents)}
    covered: Counter[tuple[int, int, int]] = Counter()
    for _ in range(400):
        packs = stream.next_packs(8)
        for pack in packs:
            check_pack_shape(pack, PACK, CORPUS.pad_id)
            check_pieces_hold_their_documents(pack, CORPUS)
            for piece in pack.pieces:
                used[_key(piece)] += 1
                if piece.epoch == 0:
                    covered[(piece.source, piece.document, 0)] += piece.length
        if set(covered) == expected:
            break
    assert set(covered) == expected, "the first epoch never completed"
    assert max(used.values()) == 1  # no piece twice, in epoch 0 or after
    lengths = {
        (s, d, 0): int(source.lengths[d]) for s, source in enumerate(CORPUS.sources) for d in range(len(source.lengths))
    }
    assert covered == lengths  # every document whole: all its pieces, each once


def test_the_same_seed_gives_the_same_packs_and_another_seed_others() -> None:
    first, second, other = _stream(dp=4), _stream(dp=4), _stream(dp=4, seed=1)
    for _ in range(7):
        a, b, c = first.next_packs(8), second.next_packs(8), other.next_packs(8)
        assert [p.pieces for p in a] == [p.pieces for p in b] and [p.pack_id for p in a] == [p.pack_id for p in b]
    assert [p.pieces for p in a] != [p.pieces for p in c]


def test_micro_steps_are_far_more_even_than_in_stream_order() -> None:
    dp, batch, steps = 4, 8, 12
    plain = PackStream(CORPUS, PACK, seed=0, lookahead=16)
    balanced = _stream(dp=dp, window=3, global_batch=batch)
    stream_order = _imbalance([plain.next_packs(batch) for _ in range(steps)], dp)
    even = _imbalance([balanced.next_packs(batch) for _ in range(steps)], dp)
    assert stream_order > 1.5  # heavy-tailed lengths: a random deal is very uneven
    assert even < 1.1 < stream_order


def test_leftover_giants_wait_for_the_next_window_once() -> None:
    giant = [Piece(0, d, 0, 0, PACK) for d in range(5)]
    small = [Piece(1, d, 0, 0, 32) for d in range(24)]  # fits beside 4 giants, and beside 5
    plan = plan_window(giant + small, steps=1, global_batch=8, dp=4, pack_tokens=PACK, first_pack_id=10)
    assert plan.waiting == [giant[4]]  # 5 giants on 4 ranks: the latest one waits
    placed = [piece for layout in plan.steps[0] for piece in layout.pieces]
    assert sorted(map(_key, placed + plan.waiting)) == sorted(map(_key, giant + small))
    assert [layout.pack_id for layout in plan.steps[0]] == list(range(10, 18))
    again = plan_window(
        giant + small, steps=1, global_batch=8, dp=4, pack_tokens=PACK, first_pack_id=10, waited={giant[4]}
    )
    assert again.waiting == [giant[3]]  # giant 4 has waited once: another one waits in its place
    never = plan_window(
        giant + small, steps=1, global_batch=8, dp=4, pack_tokens=PACK, first_pack_id=10, waited=set(giant)
    )
    assert never.waiting == []


@pytest.mark.parametrize("taken", [1, 2, 3, 4])  # mid-window (window of 3 steps), its end, and the next one
def test_a_saved_position_resumes_exactly(taken: int) -> None:
    uninterrupted = _stream(dp=4)
    interrupted = _stream(dp=4)
    for _ in range(taken):
        uninterrupted.next_packs(8)
        interrupted.next_packs(8)
    resumed = _stream(dp=4)
    resumed.load_state_dict(interrupted.state_dict())
    for _ in range(5):
        want, got = uninterrupted.next_packs(8), resumed.next_packs(8)
        assert [(p.pack_id, p.pieces) for p in got] == [(p.pack_id, p.pieces) for p in want]


def test_resuming_on_another_number_of_processes_uses_the_rest_of_the_window_once() -> None:
    window, batch = 3, 8
    saved = _stream(dp=4, window=window, global_batch=batch)
    before = [pack for _ in range(1) for pack in saved.next_packs(batch)]
    on_4 = _continue(saved, dp=4)
    rest_on_4 = [pack for _ in range(window - 1) for pack in on_4.next_packs(batch)]
    resumed = _stream(dp=2, window=window, global_batch=batch)
    resumed.load_state_dict(saved.state_dict())
    rest_on_2 = [pack for _ in range(window - 1) for pack in resumed.next_packs(batch)]
    # The same packs (ids and contents) finish the window, dealt to 2 ranks instead of 4; nothing repeats.
    assert sorted((p.pack_id, p.pieces) for p in rest_on_2) == sorted((p.pack_id, p.pieces) for p in rest_on_4)
    assert not {p.pack_id for p in before} & {p.pack_id for p in rest_on_2}
    # A position saved after the re-deal resumes exactly too.
    again = _stream(dp=2, window=window, global_batch=batch)
    again.load_state_dict(resumed.state_dict())
    assert [p.pieces for p in again.next_packs(batch)] == [p.pieces for p in resumed.next_packs(batch)]


def _continue(saved: PackStream, dp: int) -> PackStream:
    """A copy of ``saved``'s position in a new stream of ``dp`` ranks (leaves ``saved`` where it is)."""
    copy = _stream(dp=dp)
    copy.load_state_dict(saved.state_dict())
    return copy


def test_a_position_saved_with_another_balance_window_is_refused() -> None:
    balanced = _stream(dp=4)
    balanced.next_packs(8)
    with pytest.raises(DataError, match=r"data\.balance_window = 3, now 0"):
        PackStream(CORPUS, PACK, seed=0, lookahead=16).load_state_dict(balanced.state_dict())
