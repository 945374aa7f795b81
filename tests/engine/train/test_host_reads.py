"""An optimizer step reads from the device once (issue 20): the logged scalars together, with the non-finite
check and clipping decided on the device. Every way a tensor's value reaches the host is counted
(``item``, ``tolist``, ``__float__``, ``__int__``, ``__bool__``, ``__index__``, ``numpy``).

AdamW's step counters are not counted: torch keeps them on the host by design (its foreach path, which the
trainer uses on the CPU, reads them there; the fused kernel the trainer uses on CUDA keeps them on the device and
reads none), so they are not a read from the device.

The whole step — forward, backward, clipping, update, for the dense and the MoE model — reads once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from xtrain.config import OptimSection
from xtrain.data.packing import Pack
from xtrain.model.sizes import model_config
from xtrain.model.transformer import Transformer
from xtrain.train.optimizer import build_optimizer
from xtrain.train.step import GlobalBatch, LossSettings, MicroBatch, train_step

READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "numpy")


class HostReads:
    def __init__(self, host_counters: set[int]) -> None:
        self.host_counters = host_counters
        self.count = 0


@contextlib.contextmanager
def counting(monkeypatch: pytest.MonkeyPatch, optimizer: torch.optim.Optimizer) -> Iterator[HostReads]:
    reads = HostReads({id(state["step"]) for state in optimizer.state.values()})

    def counted(original: Callable[..., Any]) -> Callable[..., Any]:
        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if id(self) not in reads.host_counters:
                reads.count += 1
            return original(self, *args, **kwargs)

        return read

    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name)))
    yield reads


def _packs(vocab: int, count: int, tokens: int) -> list[Pack]:
    generator = np.random.default_rng(0)
    packs = []
    for index in range(count):
        ids = generator.integers(0, vocab, size=tokens).astype(np.int64)
        labels = np.concatenate([ids[1:], [-100]]).astype(np.int64)
        cu_seqlens = np.array([0, tokens // 2, tokens], dtype=np.int32)
        num_loss = int((labels != -100).sum())
        packs.append(Pack(pack_id=index, input_ids=ids, labels=labels, cu_seqlens=cu_seqlens, num_loss_tokens=num_loss))
    return packs


def _step_reads(monkeypatch: pytest.MonkeyPatch, size: str, max_grad_norm: float) -> HostReads:
    torch.manual_seed(0)
    config = model_config(size)
    model = Transformer(config)
    model.init_weights(seed=0)
    optimizer = build_optimizer(model, OptimSection(lr=1e-3), torch.device("cpu"))
    packs = _packs(config.vocab_size, 2, 64)
    micro_batches = [MicroBatch.from_pack(pack, torch.device("cpu")) for pack in packs]
    settings = LossSettings(chunk_tokens=32, aux_loss_coef=0.01, z_loss_coef=0.001, max_grad_norm=max_grad_norm)
    train_step(model, optimizer, micro_batches, GlobalBatch.of(packs), settings, dp_size=1)  # warm-up, uncounted
    with counting(monkeypatch, optimizer) as reads:
        result = train_step(model, optimizer, micro_batches, GlobalBatch.of(packs), settings, dp_size=1)
    assert np.isfinite(result.loss) and result.grad_norm > 0 and not result.skipped
    return reads


@pytest.mark.parametrize(
    ("size", "max_grad_norm"),
    [("debug-dense", 1e-3), ("debug-dense", 0.0), ("debug", 1e-3)],  # 1e-3 clips: the norms are far above it
)
def test_a_step_reads_from_the_device_once(monkeypatch: pytest.MonkeyPatch, size: str, max_grad_norm: float) -> None:
    assert _step_reads(monkeypatch, size, max_grad_norm).count == 1


def test_the_counter_sees_a_read_from_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: one more read of a device tensor (here of the loss) is counted."""
    tensor = torch.ones(3)
    with counting(monkeypatch, torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)) as reads:
        float(tensor.sum())
        tensor.tolist()
        bool(tensor.any())
    assert reads.count == 3
