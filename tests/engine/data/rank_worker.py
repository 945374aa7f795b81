"""What each rank runs in the two-process cache test (a module of its own: spawned processes import it by name)."""

from typing import Any

from xtrain.data import DataConfig, PackStream, cache, prepare_corpus
from xtrain.parallel.distributed import barrier, close_distributed, init_distributed


def prepare_on_rank(config: DataConfig, part_bytes: int, num_packs: int) -> dict[str, Any]:
    """Prepare the corpus as the trainer does (this rank's share, then a barrier), and read the first packs."""
    cache.PART_BYTES = part_bytes  # the same small parts as the single-process reference
    dist_ctx = init_distributed("cpu")
    try:
        corpus = prepare_corpus(
            config, rank=dist_ctx.rank, world_size=dist_ctx.world_size, barrier=barrier, log=lambda _: None
        )
        stream = PackStream(corpus, config.pack_tokens, seed=0)
        packs = [pack.input_ids.tolist() for pack in stream.next_packs(num_packs)]
        return {"parts_built": corpus.parts_built, "packs": packs, "state": stream.state_dict()}
    finally:
        close_distributed()
