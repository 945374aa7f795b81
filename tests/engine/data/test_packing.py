"""Packing: every pack is exactly ``pack_tokens`` long with consistent cu_seqlens, a document longer than a pack
is cut into pieces of ``pack_tokens`` (the last holds the rest) and a shorter one is never cut, padding comes
last, and no token is lost or repeated within an epoch (a property test over random corpora)."""

import itertools
from collections import defaultdict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from xtrain.data import Corpus, Pack, PackStream
from xtrain.data.packing import IGNORE_INDEX

from .corpora import segments, synthetic_corpus


def check_pack_shape(pack: Pack, pack_tokens: int, pad_id: int) -> None:
    assert pack.input_ids.shape == pack.labels.shape == (pack_tokens,)
    cu = pack.cu_seqlens.tolist()
    assert cu[0] == 0 and cu[-1] == pack_tokens
    assert all(end > start for start, end in itertools.pairwise(cu))  # no empty segment
    lengths = [piece.length for piece in pack.pieces]
    used = sum(lengths)
    # One segment per piece, then the padding as a segment of its own when there is any.
    assert np.diff(cu).tolist() == lengths + ([pack_tokens - used] if used < pack_tokens else [])
    assert (pack.input_ids[used:] == pad_id).all() and (pack.labels[used:] == IGNORE_INDEX).all()
    assert pack.num_padding == pack_tokens - used


def check_pieces_hold_their_documents(pack: Pack, corpus: Corpus) -> None:
    for piece, (start, end) in zip(pack.pieces, segments(pack.cu_seqlens), strict=False):
        ids, _ = corpus.sources[piece.source].document(piece.document)
        assert pack.input_ids[start:end].tolist() == ids[piece.start : piece.start + piece.length].tolist()


def first_epoch_of_every_source(stream: PackStream, corpus: Corpus, max_packs: int) -> list[Pack]:
    """Packs until every piece of every source's first epoch has come out."""
    pack_tokens = stream.pack_tokens
    expected = {
        s: sum(-(-int(length) // pack_tokens) for length in source.lengths) for s, source in enumerate(corpus.sources)
    }
    seen: defaultdict[int, int] = defaultdict(int)
    packs = []
    while any(seen[s] < count for s, count in expected.items()):
        assert len(packs) < max_packs, "the first epoch never completes"
        pack = stream.next_packs(1)[0]
        for piece in pack.pieces:
            seen[piece.source] += piece.epoch == 0
        packs.append(pack)
    return packs


corpora = st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=8), min_size=1, max_size=3)


@settings(max_examples=30, deadline=None)
@given(
    lengths=corpora,
    pack_tokens=st.integers(1, 16),
    lookahead=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    weights=st.lists(st.floats(0.2, 5.0), min_size=3, max_size=3),
)
def test_packs_are_full_length_and_an_epoch_holds_every_token_once(
    lengths: list[list[int]], pack_tokens: int, lookahead: int, seed: int, weights: list[float]
) -> None:
    corpus = synthetic_corpus(lengths, weights[: len(lengths)])
    stream = PackStream(corpus, pack_tokens, seed, lookahead=lookahead)
    packs = first_epoch_of_every_source(stream, corpus, max_packs=5000)

    epoch_tokens: defaultdict[int, list[int]] = defaultdict(list)
    pieces_of: defaultdict[tuple[int, int, int], list[tuple[int, int]]] = defaultdict(list)
    for pack_id, pack in enumerate(packs):
        assert pack.pack_id == pack_id
        check_pack_shape(pack, pack_tokens, corpus.pad_id)
        check_pieces_hold_their_documents(pack, corpus)
        for piece, (start, end) in zip(pack.pieces, segments(pack.cu_seqlens), strict=False):
            pieces_of[piece.source, piece.document, piece.epoch].append((piece.start, piece.length))
            if piece.epoch == 0:
                epoch_tokens[piece.source] += pack.input_ids[start:end].tolist()

    # Every token value is unique in the synthetic corpus: an epoch is each of its source's tokens exactly once.
    for s, source in enumerate(corpus.sources):
        assert sorted(epoch_tokens[s]) == source.parts[0].tokens.tolist()
    # The cutting rule, checked on each document of the first epoch.
    for (s, document, epoch), pieces in pieces_of.items():
        if epoch > 0:
            continue
        length = int(corpus.sources[s].lengths[document])
        starts = list(range(0, length, pack_tokens))
        assert sorted(pieces) == [(start, min(pack_tokens, length - start)) for start in starts]


def test_the_lookahead_fills_a_pack_with_the_waiting_pieces_that_fit() -> None:
    corpus = synthetic_corpus([[4] * 6])
    # Two pieces of 4 fill a pack of 8 when the packer may look past the oldest piece...
    assert [pack.num_padding for pack in PackStream(corpus, 8, seed=0, lookahead=2).next_packs(5)] == [0] * 5
    # ...and with a lookahead of 1 each pack is the oldest piece alone, then padding.
    packs = PackStream(corpus, 8, seed=0, lookahead=1).next_packs(5)
    assert [(len(pack.pieces), pack.num_padding) for pack in packs] == [(1, 4)] * 5


def test_a_document_longer_than_a_pack_fills_whole_packs_before_its_remainder() -> None:
    corpus = synthetic_corpus([[23]])  # one document: 23 = 10 + 10 + 3 with packs of 10
    packs = PackStream(corpus, 10, seed=0, lookahead=1).next_packs(3)
    pieces = [[(piece.start, piece.length) for piece in pack.pieces] for pack in packs]
    assert pieces == [[(0, 10)], [(10, 10)], [(20, 3)]]
    assert np.concatenate([pack.input_ids for pack in packs])[:23].tolist() == list(range(1, 24))
    # The last token of a cut piece still predicts the document's next token; the document's last has no label.
    assert packs[0].labels[-1] == 11 and packs[1].labels[-1] == 21 and packs[2].labels[2] == IGNORE_INDEX
