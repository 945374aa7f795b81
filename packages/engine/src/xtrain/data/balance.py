"""Data-parallel balance: within a window of optimizer steps, packs formed and placed so that at every micro-step
the ranks do the same attention work.

Every rank runs one pack per micro-step and then waits for the others at the next FSDP collective, so a
micro-step lasts as long as its most expensive pack. Packs hold the same number of tokens, so the linear layers
cost the same everywhere; what differs is attention, whose work grows with the square of each document's length:
the cost model is ``sum(length²)`` over a pack's pieces (causal attention over a document of n tokens does n²/2
query-key products; the constant does not matter for balance).

For a window of ``steps`` optimizer steps (``data.balance_window``), the packer first forms ``steps ×
global_batch`` packs as without balance, then takes their pieces apart and forms them again (:func:`plan_window`):

1. The window's packs are laid out in *groups* of ``dp``: the packs the ranks run at one micro-step.
2. Pieces are placed longest first, each in the pack that lies furthest below the most expensive pack of its own
   group and still has room for it (ties: the pack with the most room, so an untouched group is started only when
   no group has a deficit the piece could fill). So a group's first pieces are of about the same size, and a
   pack whose first piece is short gets the next long pieces that fit, before any short ones: long pieces make
   the coarse corrections, the many short ones the fine ones.
3. Pieces as long as a whole pack (``giants``: cost pack_tokens², nothing can match them but another giant) come
   in groups of ``dp``: when fewer than ``dp / 2`` are left over, those (the latest in the stream) wait for the
   next window, at the front of the waiting pieces. A piece waits at most once (the data position remembers
   which did), so it is late by one window at most. A piece that finds no room anywhere also waits.
4. Groups are dealt to the window's steps (most expensive first, in snake order, so steps cost about the same)
   and the ``dp`` packs of a group go to the ``dp`` ranks at the same micro-step.

Every piece of the window's packs is used exactly once (in this window, or the next one for those that wait), so
each document is still used exactly once per epoch. Everything depends only on the pieces and ``dp``: every rank
computes the same plan, and the data position (the window's start, how many of its steps were taken) restores it
exactly (:class:`BalancedLayouts`). Resuming with another number of processes re-deals the window's remaining
packs to the new ranks (:func:`deal`), unchanged in content.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from xtrain.data.packing import PackBuilder, PackLayout, Piece


def pack_cost(pieces: Sequence[Piece]) -> int:
    """Attention cost of a pack: the sum of its pieces' squared lengths."""
    return sum(piece.length * piece.length for piece in pieces)


@dataclass(frozen=True)
class WindowPlan:
    """A window's packs in the order the trainer takes them, and the pieces that wait for the next window."""

    steps: list[list[PackLayout]]
    """Per step, ``global_batch`` layouts; rank r's micro-step j is index ``r × (global_batch / dp) + j``."""
    waiting: list[Piece]
    """Pieces that go to the next window, in stream order."""


def plan_window(
    pieces: Sequence[Piece],
    *,
    steps: int,
    global_batch: int,
    dp: int,
    pack_tokens: int,
    first_pack_id: int,
    waited: frozenset[Piece] | set[Piece] = frozenset(),
) -> WindowPlan:
    """Form ``steps × global_batch`` packs from ``pieces`` (in stream order) and place them; see the module
    docstring. ``waited``: giants that have waited once already (they may not wait again)."""
    num_packs = steps * global_batch
    order = sorted(range(len(pieces)), key=lambda i: (-pieces[i].length, i))
    waiting = _giants_that_wait(pieces, order, dp, pack_tokens, waited)
    placed = [i for i in order if i not in waiting]

    members: list[list[int]] = [[] for _ in range(num_packs)]
    cost = np.zeros(num_packs, dtype=np.int64)
    room = np.full(num_packs, pack_tokens, dtype=np.int64)
    group_of = np.arange(num_packs) // dp
    group_max = np.zeros(num_packs // dp, dtype=np.int64)
    for index in placed:
        length = pieces[index].length
        # Deficit below the group's most expensive pack first, then room (exact, in one int64 score).
        score = (group_max[group_of] - cost) * (pack_tokens + 1) + room
        score[room < length] = -1
        pack = int(score.argmax())
        if score[pack] < 0:
            waiting.add(index)  # no room anywhere: the next window
            continue
        members[pack].append(index)
        cost[pack] += length * length
        room[pack] -= length
        group = pack // dp
        group_max[group] = max(group_max[group], cost[pack])

    groups = [
        [tuple(pieces[i] for i in sorted(members[pack])) for pack in range(g * dp, (g + 1) * dp)]
        for g in range(num_packs // dp)
    ]
    costs = [sum(pack_cost(pack) for pack in group) for group in groups]
    per_step = [
        [PackLayout(first_pack_id + step * global_batch + slot, groups[g][rank]) for slot, (g, rank) in enumerate(row)]
        for step, row in enumerate(_slots(costs, steps, global_batch, dp))
    ]
    return WindowPlan(steps=per_step, waiting=[pieces[i] for i in sorted(waiting)])


def deal(layouts: Sequence[PackLayout], *, steps: int, global_batch: int, dp: int) -> list[list[PackLayout]]:
    """Place already formed packs on ``steps`` steps of ``dp`` ranks: sorted by cost, ``dp`` consecutive ones per
    micro-step (what a resume with another number of processes does with a window's remaining packs). Each pack
    keeps its id."""
    ranked = sorted(layouts, key=lambda layout: (-pack_cost(layout.pieces), layout.pack_id))
    groups = [ranked[g : g + dp] for g in range(0, len(ranked), dp)]
    costs = [sum(pack_cost(layout.pieces) for layout in group) for group in groups]
    return [[groups[g][rank] for g, rank in step] for step in _slots(costs, steps, global_batch, dp)]


def _giants_that_wait(
    pieces: Sequence[Piece], order: list[int], dp: int, pack_tokens: int, waited: frozenset[Piece] | set[Piece]
) -> set[int]:
    giants = [i for i in order if pieces[i].length == pack_tokens]
    extra = len(giants) % dp
    latest_first = sorted((i for i in giants if pieces[i] not in waited), reverse=True)
    if extra == 0 or extra * 2 >= dp or len(latest_first) < extra:
        return set()  # a group of giants with a few others in it costs less than what waiting would save
    return set(latest_first[:extra])


def _slots(group_costs: list[int], steps: int, global_batch: int, dp: int) -> list[list[tuple[int, int]]]:
    """Groups (dp packs each) to steps: most expensive first, in snake order; per step, the (group, rank) of each
    slot, rank r of the step's j-th group in slot ``r × micro + j``."""
    micro = global_batch // dp
    if len(group_costs) != steps * micro:
        raise ValueError(f"{len(group_costs)} groups of {dp} packs do not fill {steps} steps of {global_batch} packs")
    by_cost = sorted(range(len(group_costs)), key=lambda g: (-group_costs[g], g))
    per_step: list[list[int]] = [[] for _ in range(steps)]
    for position, group in enumerate(by_cost):
        lap, at = divmod(position, steps)
        per_step[at if lap % 2 == 0 else steps - 1 - at].append(group)
    return [[(chosen[j], rank) for rank in range(dp) for j in range(micro)] for chosen in per_step]


class BalancedLayouts:
    """The pack layouts of a balanced run, one step at a time, and their data position."""

    def __init__(self, builder: PackBuilder, *, window_steps: int, global_batch: int, dp: int) -> None:
        if window_steps <= 0 or dp <= 0 or global_batch % dp:
            raise ValueError(f"balance needs window_steps > 0 and global_batch % dp == 0, got {window_steps}, {dp}")
        self._builder = builder
        self.window_steps = window_steps
        self.global_batch = global_batch
        self.dp = dp
        self._waited: set[Piece] = set()
        """Giants waiting in the builder that have waited once (they are placed in the next window)."""
        self._window: list[list[PackLayout]] = []
        self._taken = 0
        self._start: dict[str, Any] = builder.snapshot()
        self._start_waited: set[Piece] = set()
        self._deals: list[list[int]] = []
        """How the current window was taken: [dp, steps taken] per number of processes it ran with."""

    def next_step(self) -> list[PackLayout]:
        if self._taken == len(self._window):
            self._form_window(self.dp)
        if self._deals[-1][0] != self.dp:
            self._redeal(self.dp)
        layouts = self._window[self._taken]
        self._taken += 1
        self._deals[-1][1] += 1
        return layouts

    def _form_window(self, dp: int) -> None:
        builder = self._builder
        self._start, self._start_waited = builder.snapshot(), set(self._waited)
        first_id = builder.next_pack_id
        count = self.window_steps * self.global_batch
        pieces = [piece for _ in range(count) for piece in builder.next_layout().pieces]
        plan = plan_window(
            pieces,
            steps=self.window_steps,
            global_batch=self.global_batch,
            dp=dp,
            pack_tokens=builder.pack_tokens,
            first_pack_id=first_id,
            waited=self._waited,
        )
        builder.waiting[:0] = plan.waiting  # first in line for the next window
        giants = {piece for piece in plan.waiting if piece.length == builder.pack_tokens}
        self._waited = (self._waited | giants) & set(builder.waiting)
        self._window, self._taken, self._deals = plan.steps, 0, [[dp, 0]]

    def _redeal(self, dp: int) -> None:
        rest = [layout for step in self._window[self._taken :] for layout in step]
        steps = len(self._window) - self._taken
        self._window = self._window[: self._taken] + deal(rest, steps=steps, global_batch=self.global_batch, dp=dp)
        self._deals.append([dp, 0])

    def state_dict(self) -> dict[str, Any]:
        """Where the current window started (builder position, giants that had waited) and how it was taken."""
        exhausted = self._taken == len(self._window)
        return {
            "window_steps": self.window_steps,
            "start": self._builder.snapshot() if exhausted else self._start,
            "waited": _pieces_state(self._waited if exhausted else self._start_waited),
            "deals": [] if exhausted else [list(entry) for entry in self._deals],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._builder.restore(state["start"])
        self._waited = {Piece(*(int(v) for v in entry)) for entry in state["waited"]}
        self._window, self._taken, self._deals = [], 0, []
        deals = [(int(dp), int(taken)) for dp, taken in state["deals"]]
        if not deals:
            return
        self._form_window(deals[0][0])  # exactly the window the saved run was in, taken as it was
        for index, (dp, taken) in enumerate(deals):
            if index:
                self._redeal(dp)
            self._taken += taken
            self._deals[-1][1] = taken


def _pieces_state(pieces: set[Piece]) -> list[list[int]]:
    return sorted([p.source, p.document, p.epoch, p.start, p.length] for p in pieces)
