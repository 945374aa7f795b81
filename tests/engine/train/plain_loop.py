"""The reference the trainer is tested against: a plain, unsharded PyTorch training loop written from the
definitions, sharing nothing with xtrain's trainer but the model class, its initialisation and the packs.

Full logits and ``F.cross_entropy`` over the whole global batch (no chunking, no gradient accumulation, no
process group); the load-balancing and z-losses written out from their formulas over the global batch, with
every pack's graph alive at once, so the counts are exact; ``torch.nn.utils.clip_grad_norm_``; AdamW from torch
with the learning rate set by hand from the schedule's formula.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from xtrain.config import TrainConfig
from xtrain.data import PackStream, prepare_corpus
from xtrain.model.sizes import model_config
from xtrain.model.transformer import Transformer


def linear_schedule_lr(step: int, lr: float, min_lr: float, warmup: int, max_steps: int) -> float:
    """Warmup to ``lr`` over ``warmup`` steps, then a straight line to ``min_lr`` at ``max_steps`` (1-based)."""
    if step <= warmup:
        return lr * step / warmup
    return lr - (lr - min_lr) * (step - warmup) / (max_steps - warmup)


def plain_training(
    config: TrainConfig,
) -> tuple[list[dict[str, float]], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Each step's {loss, aux_loss, z_loss, grad_norm}, the initial weights, and the weights after the last step."""
    assert config.optim.schedule == "linear", "the reference writes out the linear schedule only"
    assert config.model.size is not None
    model = Transformer(model_config(config.model.size))
    model.init_weights(config.train.seed)
    initial = _copy(model)
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": matrices, "weight_decay": config.optim.weight_decay}, {"params": vectors, "weight_decay": 0.0}],
        lr=config.optim.lr,
        betas=config.optim.betas,
        eps=config.optim.eps,
    )
    moe = model.config.moe
    aux_coef = config.loss.aux_loss_coef if config.loss.aux_loss_coef is not None else (moe.aux_loss_coef if moe else 0)
    z_coef = config.loss.z_loss_coef if config.loss.z_loss_coef is not None else (moe.z_loss_coef if moe else 0)
    corpus = prepare_corpus(config.data)
    stream = PackStream(corpus, config.data.pack_tokens, seed=config.train.seed, lookahead=config.data.pack_lookahead)
    history = []
    for step in range(1, config.train.max_steps + 1):
        lr = linear_schedule_lr(
            step, config.optim.lr, config.optim.min_lr, config.optim.warmup_steps, config.train.max_steps
        )
        for group in optimizer.param_groups:
            group["lr"] = lr
        packs = stream.next_packs(config.train.global_batch)
        targets = sum(int((torch.from_numpy(p.labels) != -100).sum()) for p in packs)
        tokens = sum(len(p.input_ids) for p in packs)
        ce = torch.zeros(())
        counts: list[torch.Tensor] = []  # per pack: [L, E]
        probs: list[torch.Tensor] = []
        z_sums: list[torch.Tensor] = []
        for pack in packs:
            ids = torch.from_numpy(pack.input_ids).unsqueeze(0)
            out = model.forward_hidden(ids, torch.from_numpy(pack.cu_seqlens).to(torch.int32))
            logits = F.linear(out.hidden[0], model.output_projection_weight)  # the full [T, V] logits
            labels = torch.from_numpy(pack.labels)
            ce = ce + F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum")
            if out.router_stats:
                counts.append(torch.stack([s.tokens_per_expert for s in out.router_stats]).double())
                probs.append(torch.stack([s.router_prob_sum for s in out.router_stats]))
                z_sums.append(torch.stack([s.z_loss_sum for s in out.router_stats]))
        ce = ce / targets
        loss = ce
        aux = z = torch.zeros(())
        if counts:
            num_experts = counts[0].shape[1]
            count_LE = torch.stack(counts).sum(0).float()
            prob_LE = torch.stack(probs).sum(0)
            aux = (num_experts * (count_LE * prob_LE).sum(-1) / tokens**2).mean()
            z = (torch.stack(z_sums).sum(0) / tokens).mean()
            loss = loss + aux_coef * aux + z_coef * z
        loss.backward()  # type: ignore[no-untyped-call]
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        figures = {"loss": ce, "aux_loss": aux, "z_loss": z, "grad_norm": grad_norm}
        history.append({key: float(value.detach()) for key, value in figures.items()})
    return history, initial, _copy(model)


def _copy(model: Transformer) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def assert_same_training(
    got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]
) -> None:
    """``got`` moved from ``initial`` as ``expected`` did, to fp32 rounding.

    Compared relative to each tensor's total update rather than element by element: AdamW divides by the
    gradient's own scale, so where a gradient is near zero its rounding shows in the update of single elements
    (seen: 1 weight in 50k off by 3e-5 after 3 steps), while a wrong gradient changes the update as a whole.
    """
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        update = (value - initial[name]).norm()
        assert update > 0, f"{name} did not move: the comparison would prove nothing"
        error = (got[name] - value).norm() / update
        assert error < 1e-3, f"{name}: differs from the plain loop by {float(error):.2e} of its update"
        worst = float((got[name] - value).abs().max())
        assert worst < 3e-4, f"{name}: one element differs by {worst:.2e} (a tenth of the learning rate)"


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12) if math.isfinite(a) and math.isfinite(b) else math.inf
