"""The held-out loss: ``[eval]``'s packs through the sharded model, with no gradients.

The packs are made once, when the run starts, from ``eval.sources`` with the training data's tokenizer, kind
and packing (``eval.pack_tokens``, default ``data.pack_tokens``), and seeded by ``train.seed`` alone: every
evaluation of a run (and of a resumed run, and ``xtrain eval``) sees the same ``eval.batches`` packs, so the
curve moves only with the weights. Each rank evaluates its share (rank r: packs r·n/W to (r+1)·n/W), through the
same chunked loss as training, normalised by the target tokens of all the packs of all ranks; one all-reduce
adds the shares, so ``eval_loss`` is the mean cross-entropy per target token over the evaluation packs. Under
expert parallelism every rank runs the same number of forwards, so the token exchanges pair up.

Nothing here draws from a random generator, so evaluating does not change what training does next (resume stays
exact).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from xtrain.config import TrainConfig
from xtrain.data import Pack, PackStream, prepare_corpus
from xtrain.model.transformer import Transformer
from xtrain.parallel.distributed import Distributed
from xtrain.train.step import GlobalBatch, LossSettings, MicroBatch, evaluation_loss


@dataclass(frozen=True)
class EvalResult:
    loss: float
    """Mean cross-entropy per target token over the evaluation packs."""

    @property
    def ppl(self) -> float:
        return math.exp(self.loss) if self.loss < 700 else math.inf


def eval_packs(
    config: TrainConfig, dist_ctx: Distributed, barrier: Callable[[], None], log: Callable[[str], None]
) -> list[Pack]:
    """Every rank's evaluation packs (the same list on every rank): ``eval.batches`` of them."""
    data = config.data.model_copy(
        update={"sources": config.eval.sources, "pack_tokens": config.eval.pack_tokens or config.data.pack_tokens}
    )
    corpus = prepare_corpus(data, rank=dist_ctx.rank, world_size=dist_ctx.world_size, barrier=barrier, log=log)
    stream = PackStream(corpus, data.pack_tokens, seed=config.train.seed, lookahead=data.pack_lookahead)
    return stream.next_packs(config.eval.batches)


class Evaluator:
    """Evaluates the model on fixed packs; ``due(step)`` says at which steps the run does."""

    def __init__(self, config: TrainConfig, packs: list[Pack], settings: LossSettings, dist_ctx: Distributed) -> None:
        self.every = config.eval.every_steps
        self.max_steps = config.train.max_steps
        self.settings = settings
        self.device = dist_ctx.device
        per_rank = len(packs) // dist_ctx.world_size
        self.mine = packs[dist_ctx.rank * per_rank : (dist_ctx.rank + 1) * per_rank]
        self.global_batch = GlobalBatch.of(packs)

    def due(self, step: int) -> bool:
        return step == self.max_steps or (self.every > 0 and step % self.every == 0)

    def evaluate(self, model: Transformer) -> EvalResult:
        """The held-out loss of ``model`` now (a collective: every rank calls it; one host read)."""
        total: Tensor = torch.zeros((), dtype=torch.float64, device=self.device)
        with torch.no_grad():
            for pack in self.mine:
                batch = MicroBatch.from_pack(pack, self.device)
                total += evaluation_loss(model, batch, self.global_batch, self.settings).double()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(total)
        return EvalResult(float(total.item()))
