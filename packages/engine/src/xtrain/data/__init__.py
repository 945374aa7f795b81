"""xtrain's data pipeline: JSONL → tokens (cached on disk) → fixed-length packs with cu_seqlens.

- ``prepare_corpus(config, rank=, world_size=, barrier=)``: build the token cache in parallel, open it as a Corpus
- ``run_prepare(config, log=)``: the same in one process with a progress bar (``xtrain data prepare``)
- ``PackStream(corpus, pack_tokens, seed)``: the infinite, resumable global sequence of packs

docs/engine-data.md describes the formats, the cache, the packing rule and the data position.
"""

from xtrain.data.config import DataConfig, DataSource
from xtrain.data.corpus import Corpus, PrepareSummary, prepare_corpus, run_prepare
from xtrain.data.packing import Pack, PackStream

__all__ = [
    "Corpus",
    "DataConfig",
    "DataSource",
    "Pack",
    "PackStream",
    "PrepareSummary",
    "prepare_corpus",
    "run_prepare",
]
