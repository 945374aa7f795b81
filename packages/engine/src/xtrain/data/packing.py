"""Fixed-length packs from the corpus: document order, pack formation and the saved data position.

Three steps, each its own class, so a later step can slot in between (issue 10's balanced packing reorders the
*layouts* of a window of packs before they are materialised):

1. :class:`DocumentOrder` — which document comes next. Each source walks its documents in a permutation drawn
   from ``(seed, source index, epoch)``; a source's epoch uses every one of its documents exactly once, then its
   next epoch starts with a new permutation. Sources are interleaved by weight in tokens: the next document comes
   from the source with the fewest tokens drawn per unit of weight (ties: the earlier source), so the token
   shares follow the weights exactly, without randomness.
2. :class:`PackBuilder` — which pieces form the next pack (a :class:`PackLayout`). A document longer than
   ``pack_tokens`` is cut into pieces of ``pack_tokens`` tokens (the last piece holds the rest); every other
   document is one piece and is never split. A pack starts with the oldest waiting piece, then takes, in stream
   order, every piece of the next ``lookahead`` waiting pieces that still fits (first fit); what is left at the end
   is padding. So no piece waits for more than ``lookahead`` packs, and padding only appears when none of the
   waiting pieces fits.
3. :class:`PackStream` — materialises layouts into :class:`Pack` arrays and owns the data position
   (``state_dict``): the document order's cursor, the waiting pieces and the next pack id.

Labels: ``labels[t]`` is the document's token after input ``t``. A piece is its own document for attention
(``cu_seqlens``; positions restart), but the last token of a piece cut from a longer document still predicts the
document's next token, so cutting loses no target. There is no label (-100) on a document's last token, on a
chat token whose *target* is not an assistant token, and on padding, which is its own segment at the end.

The stream depends on the corpus, ``pack_tokens``, ``seed`` and ``lookahead`` only: never on the world size;
except with data-parallel balance (``data.balance_window``, :mod:`xtrain.data.balance`), which forms and places a
window's packs for the ranks that run them, between steps 2 and 3.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from xtrain.data.corpus import Corpus
from xtrain.errors import DataError

if TYPE_CHECKING:
    from xtrain.data.balance import BalancedLayouts

IGNORE_INDEX = -100
"""Label of a position without loss (the cross-entropy ignore index)."""
STATE_FORMAT = 1
DEFAULT_LOOKAHEAD = 64
"""Waiting pieces the packer may search to fill a pack (``DataConfig.pack_lookahead``'s default)."""


@dataclass(frozen=True)
class Piece:
    """A run of tokens of one document: the whole document, or one cut of a document longer than a pack."""

    source: int
    document: int
    epoch: int
    """The source's epoch this document was drawn in."""
    start: int
    """First token of the piece inside its document."""
    length: int


@dataclass(frozen=True)
class Pack:
    """One row of exactly ``pack_tokens`` tokens: what a rank feeds the model for one micro-batch."""

    pack_id: int
    """Global index of this pack in the stream (0, 1, 2, ...), the same on every rank."""
    input_ids: npt.NDArray[np.int64]
    """int64 [pack_tokens]."""
    labels: npt.NDArray[np.int64]
    """int64 [pack_tokens]: the token input t predicts, -100 where there is no loss."""
    cu_seqlens: npt.NDArray[np.int32]
    """int32 [segments + 1]: 0, the end of each piece, then ``pack_tokens`` (padding is the last segment)."""
    num_loss_tokens: int
    """How many labels are not -100."""
    pieces: tuple[Piece, ...] = field(default=())
    """The document pieces in the row, in order (padding is not a piece)."""

    @property
    def num_padding(self) -> int:
        return len(self.input_ids) - sum(piece.length for piece in self.pieces)


@dataclass(frozen=True)
class Balance:
    """Data-parallel balance of a stream: windows of ``window_steps`` steps of ``global_batch`` packs over ``dp``
    ranks (``data.balance_window``; see :mod:`xtrain.data.balance`)."""

    window_steps: int
    global_batch: int
    dp: int


@dataclass(frozen=True)
class PackLayout:
    """Which pieces make up pack ``pack_id`` (the cheap description a reordering step can look at)."""

    pack_id: int
    pieces: tuple[Piece, ...]


class DocumentOrder:
    """The infinite sequence of documents: per-source shuffled epochs, interleaved by weight in tokens."""

    def __init__(self, corpus: Corpus, seed: int) -> None:
        self._corpus = corpus
        self._seed = seed
        self._weights = [source.weight for source in corpus.sources]
        count = len(corpus.sources)
        self.epochs = [0] * count
        self.positions = [0] * count
        self.tokens_drawn = [0] * count
        self._orders: list[npt.NDArray[np.int64] | None] = [None] * count

    def next_document(self) -> tuple[int, int, int]:
        """(source, document, epoch) of the next document, and advance."""
        shares = [drawn / weight for drawn, weight in zip(self.tokens_drawn, self._weights, strict=True)]
        source = shares.index(min(shares))
        order = self._order(source)
        document = int(order[self.positions[source]])
        epoch = self.epochs[source]
        self.tokens_drawn[source] += int(self._corpus.sources[source].lengths[document])
        self.positions[source] += 1
        if self.positions[source] == len(order):
            self.epochs[source] += 1
            self.positions[source] = 0
            self._orders[source] = None
        return source, document, epoch

    def state_dict(self) -> list[dict[str, int]]:
        return [
            {"epoch": epoch, "position": position, "tokens_drawn": drawn}
            for epoch, position, drawn in zip(self.epochs, self.positions, self.tokens_drawn, strict=True)
        ]

    def load_state_dict(self, state: Sequence[dict[str, int]]) -> None:
        self.epochs = [int(entry["epoch"]) for entry in state]
        self.positions = [int(entry["position"]) for entry in state]
        self.tokens_drawn = [int(entry["tokens_drawn"]) for entry in state]
        self._orders = [None] * len(state)

    def _order(self, source: int) -> npt.NDArray[np.int64]:
        order = self._orders[source]
        if order is None:
            generator = np.random.default_rng([self._seed, source, self.epochs[source]])
            order = generator.permutation(self._corpus.sources[source].num_documents).astype(np.int64)
            self._orders[source] = order
        return order


class PackBuilder:
    """Groups the document order's pieces into pack layouts (first fit over a window of waiting pieces)."""

    def __init__(self, corpus: Corpus, pack_tokens: int, seed: int, lookahead: int) -> None:
        if pack_tokens <= 0 or lookahead <= 0:
            raise ValueError(f"pack_tokens ({pack_tokens}) and lookahead ({lookahead}) must be positive")
        self._corpus = corpus
        self.pack_tokens = pack_tokens
        self.lookahead = lookahead
        self.order = DocumentOrder(corpus, seed)
        self.waiting: list[Piece] = []
        self.next_pack_id = 0

    def next_layout(self) -> PackLayout:
        while len(self.waiting) < self.lookahead:
            self._draw_document()
        chosen = [self.waiting.pop(0)]
        room = self.pack_tokens - chosen[0].length
        taken: list[int] = []
        for index, piece in enumerate(self.waiting[: self.lookahead - 1]):
            if room == 0:
                break
            if piece.length <= room:
                taken.append(index)
                room -= piece.length
        chosen.extend(self.waiting[index] for index in taken)
        for index in reversed(taken):
            del self.waiting[index]
        layout = PackLayout(self.next_pack_id, tuple(chosen))
        self.next_pack_id += 1
        return layout

    def snapshot(self) -> dict[str, Any]:
        """The builder's position: the document order's cursor, the waiting pieces and the next pack id."""
        return {
            "next_pack_id": self.next_pack_id,
            "sources": self.order.state_dict(),
            "waiting": [[p.source, p.document, p.epoch, p.start, p.length] for p in self.waiting],
        }

    def restore(self, position: dict[str, Any]) -> None:
        self.next_pack_id = int(position["next_pack_id"])
        self.order.load_state_dict(position["sources"])
        self.waiting = [Piece(*(int(value) for value in entry)) for entry in position["waiting"]]

    def _draw_document(self) -> None:
        source, document, epoch = self.order.next_document()
        length = int(self._corpus.sources[source].lengths[document])
        for start in range(0, length, self.pack_tokens):
            self.waiting.append(Piece(source, document, epoch, start, min(self.pack_tokens, length - start)))


class PackStream:
    """The one global, infinite, resumable sequence of packs (every rank builds the same one)."""

    def __init__(
        self,
        corpus: Corpus,
        pack_tokens: int,
        seed: int,
        *,
        lookahead: int = DEFAULT_LOOKAHEAD,
        balance: Balance | None = None,
    ) -> None:
        if corpus.num_documents == 0 or any(source.num_documents == 0 for source in corpus.sources):
            raise DataError("every data source needs at least one document to pack")
        self._corpus = corpus
        self._seed = seed
        self._builder = PackBuilder(corpus, pack_tokens, seed, lookahead)
        self._balanced: BalancedLayouts | None = None
        if balance is not None:
            from xtrain.data.balance import BalancedLayouts as Balanced  # noqa: PLC0415 (it builds on this module)

            self._balanced = Balanced(
                self._builder, window_steps=balance.window_steps, global_batch=balance.global_batch, dp=balance.dp
            )

    @property
    def pack_tokens(self) -> int:
        return self._builder.pack_tokens

    @property
    def epochs(self) -> list[int]:
        """Current epoch of each source (how many full passes over it the stream has drawn)."""
        return list(self._builder.order.epochs)

    def next_packs(self, n: int) -> list[Pack]:
        """The next ``n`` packs of the global order. Balanced, ``n`` is the global batch: one step's packs, rank
        r's micro-step j at index ``r × (n / dp) + j`` (see :mod:`xtrain.data.balance`)."""
        if self._balanced is None:
            return [self.materialize(self._builder.next_layout()) for _ in range(n)]
        if n != self._balanced.global_batch:
            raise ValueError(f"a balanced stream gives one step of {self._balanced.global_batch} packs, not {n}")
        return [self.materialize(layout) for layout in self._balanced.next_step()]

    def materialize(self, layout: PackLayout) -> Pack:
        """The arrays of one layout: ids, labels (see the module docstring), cu_seqlens, padding at the end."""
        pack_tokens = self.pack_tokens
        input_ids = np.full(pack_tokens, self._corpus.pad_id, dtype=np.int64)
        labels = np.full(pack_tokens, IGNORE_INDEX, dtype=np.int64)
        bounds = [0]
        for piece in layout.pieces:
            ids, loss_mask = self._corpus.sources[piece.source].document(piece.document)
            at, end = bounds[-1], bounds[-1] + piece.length
            input_ids[at:end] = ids[piece.start : piece.start + piece.length]
            # Targets are the document's next tokens; a document's last token has none.
            target_end = min(piece.start + piece.length + 1, len(ids))
            targets = ids[piece.start + 1 : target_end].astype(np.int64)
            if loss_mask is not None:
                targets = np.where(loss_mask[piece.start + 1 : target_end] != 0, targets, IGNORE_INDEX)
            labels[at : at + len(targets)] = targets
            bounds.append(end)
        if bounds[-1] < pack_tokens:
            bounds.append(pack_tokens)  # padding: a segment of its own, without labels
        return Pack(
            pack_id=layout.pack_id,
            input_ids=input_ids,
            labels=labels,
            cu_seqlens=np.asarray(bounds, dtype=np.int32),
            num_loss_tokens=int(np.count_nonzero(labels != IGNORE_INDEX)),
            pieces=layout.pieces,
        )

    def state_dict(self) -> dict[str, Any]:
        """The data position (JSON-serialisable, small): restoring it yields exactly the packs that come next."""
        builder = self._builder
        return {
            "format": STATE_FORMAT,
            "seed": self._seed,
            "pack_tokens": builder.pack_tokens,
            "lookahead": builder.lookahead,
            "corpus": self._corpus_signature(),
            **builder.snapshot(),
            **({"balance": self._balanced.state_dict()} if self._balanced is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved data position; DataError when it belongs to other data or other settings."""
        builder = self._builder
        expected = {
            "format": STATE_FORMAT,
            "seed": self._seed,
            "pack_tokens": builder.pack_tokens,
            "lookahead": builder.lookahead,
            "corpus": self._corpus_signature(),
        }
        for key, value in expected.items():
            if state.get(key) != value:
                raise DataError(
                    f"the saved data position does not fit this run: {key} was {state.get(key)!r}, now {value!r} "
                    "(resuming needs the same data files, tokenizer, data.pack_tokens, data.pack_lookahead and seed)"
                )
        saved_window = state.get("balance", {}).get("window_steps", 0)
        window = self._balanced.window_steps if self._balanced is not None else 0
        if saved_window != window:
            raise DataError(
                f"the saved data position was taken with data.balance_window = {saved_window}, now {window} "
                "(resuming needs the same data.balance_window)"
            )
        builder.restore(state)
        if self._balanced is not None:
            self._balanced.load_state_dict(state["balance"])

    def _corpus_signature(self) -> list[list[int]]:
        # Documents and tokens per source: a position saved on other data would index other documents.
        return [[source.num_documents, source.num_tokens] for source in self._corpus.sources]
