"""The auxiliary-loss-free balancing of sigmoid routers (DeepSeek-V3): after each optimizer step every rank
applies the same correction-bias update, computed from the expert counts of the whole global batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from xtrain.data import Pack
from xtrain.model.config import ModelConfig
from xtrain.model.sizes import model_config
from xtrain.model.transformer import Transformer

from tests.engine.parallel.ranks import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

RATE = 0.01
TOKENS = 48


def _sigmoid_config() -> ModelConfig:
    base = model_config("debug")
    assert base.moe is not None
    moe = base.moe.model_copy(
        update={"router": "sigmoid_group_limited", "n_group": 2, "topk_group": 1, "bias_update_rate": RATE}
    )
    return base.model_copy(update={"moe": moe})


def _packs() -> list[Pack]:
    generator = np.random.default_rng(7)
    packs = []
    for pack_id in range(2):
        ids = generator.integers(0, 512, TOKENS).astype(np.int64)
        labels = np.concatenate([ids[1:], [-100]]).astype(np.int64)
        cu = np.array([0, 20, TOKENS], dtype=np.int32)
        packs.append(Pack(pack_id, ids, labels, cu, int((labels != -100).sum())))
    return packs


def _train_one_step_in_rank() -> list[torch.Tensor]:
    from xtrain.config import OptimSection, ParallelSection
    from xtrain.parallel.distributed import init_distributed
    from xtrain.parallel.fsdp import apply_fsdp
    from xtrain.parallel.layout import check_layout
    from xtrain.parallel.materialize import materialize
    from xtrain.parallel.mesh import model_meshes
    from xtrain.train.optimizer import build_optimizer
    from xtrain.train.step import GlobalBatch, LossSettings, MicroBatch, train_step

    ctx = init_distributed("cpu")
    with torch.device("meta"):
        model = Transformer(_sigmoid_config())
    mesh = model_meshes(check_layout(ParallelSection(), ctx.world_size), "cpu").dense
    apply_fsdp(model, mesh, param_dtype=torch.float32)
    materialize(model, ctx.device, seed=0)
    optimizer = build_optimizer(model, OptimSection(), ctx.device)
    packs = _packs()
    mine = [MicroBatch.from_pack(packs[ctx.rank], ctx.device)]
    settings = LossSettings(chunk_tokens=32, aux_loss_coef=0.0, z_loss_coef=0.0, max_grad_norm=1.0)
    train_step(model, optimizer, mine, GlobalBatch.of(packs), settings, dp_size=ctx.world_size)
    biases = [layer.moe.router.e_score_correction_bias.detach().clone() for layer in model.layers if layer.moe]
    torch.distributed.destroy_process_group()
    return biases


def test_every_rank_applies_the_bias_update_of_the_global_counts(tmp_path: Path) -> None:
    per_rank = run_ranks(2, _train_one_step_in_rank, tmp_dir=tmp_path)

    # The reference: the unsharded model routes both packs; DeepSeek-V3's rule on the summed counts.
    model = Transformer(_sigmoid_config())
    model.init_weights(0)
    counts = None
    with torch.no_grad():
        for pack in _packs():
            out = model.forward_hidden(torch.from_numpy(pack.input_ids).unsqueeze(0), torch.from_numpy(pack.cu_seqlens))
            layer_counts = torch.stack([s.tokens_per_expert for s in out.router_stats]).float()
            counts = layer_counts if counts is None else counts + layer_counts
    assert counts is not None
    expected = [RATE * torch.sign(c.mean() - c) for c in counts]

    assert len(per_rank[0]) == len(expected) == 3  # the debug model's three MoE layers
    for rank_biases in per_rank:
        for got, want in zip(rank_biases, expected, strict=True):
            assert got.dtype == torch.float32
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert any(bool(b.ne(0).any()) for b in per_rank[0])  # the update really moved the biases
