"""Training throughput: xtrain against the same model in Hugging Face transformers, both under FSDP2.

Both sides train the `debug` model of xtrain.model.sizes (4 layers, hidden 128, 8 experts top-2, layer 0 dense,
vocabulary 512) with the same weights, in N processes (default 2; gloo on the CPU, one thread each; NCCL and
bf16 compute on CUDA), on the same packs of tokens, with AdamW (lr 3e-3, weight decay 0.1 on matrices), gradient
clipping at 1.0 and a load-balancing loss of coefficient 0.001 on both sides:

- xtrain: the model built on the meta device, ``xtrain.parallel.fsdp.apply_fsdp`` (one FSDP2 group per layer,
  explicit prefetch), ``materialize`` from the shared Hugging Face folder, ``build_optimizer`` and
  ``xtrain.train.step.train_step`` (chunked loss through ``forward_with_head``, global-batch balancing loss).
- transformers: ``Qwen3MoeForCausalLM.from_pretrained`` of that same folder (sdpa attention, transformers'
  default experts implementation), ``fully_shard`` on each decoder layer then on the root (same precision
  policy), a plain loop: ``model(input_ids, position_ids, labels, shift_labels, num_items_in_batch)`` so that
  transformers computes its own full-logits loss (plus ``router_aux_loss_coef`` × its balancing loss with
  ``output_router_logits``), backward, ``clip_grad_norm_``, ``AdamW.step``.

Packs (the same for both sides): rows of ``--pack-tokens`` tokens holding several documents (lengths drawn
from an exponential distribution of mean ``--mean-doc``), random token ids; each label is the next token of the
same document, -100 on the last token of a document. xtrain gets the document boundaries (cu_seqlens) and runs
attention per document. transformers gets position ids that restart at every document and no attention mask:
transformers 5 then detects the packing and builds a block-diagonal causal mask for sdpa, so both sides compute
the same function (the first step's cross-entropy is compared: ``first_step_ce_rel_diff``). The work is not
the same: transformers' sdpa attends over the whole row under a mask (T² per row) where xtrain attends per
document (Σ length²); that is part of what is measured, as it is what a user of each gets. ``--docs single``
puts one document in each row instead, which makes the attention work equal on both sides.

Timing: several warmup steps of each side, then ``--rounds`` rounds; in each round each side runs
``--steps-per-round`` optimizer steps over the same global batches (alternating which side goes first), timed
between barriers on rank 0. tokens/s = tokens of the global batch / median step time. With ``--profile``, one
more step of each side runs under the PyTorch profiler and rank 0 prints the top operators by self CPU time.
With ``--breakdown``, each side's timed steps also record the wall time of their phases on rank 0 (forward,
backward, and the update's parts: the trainer's own collectives, clipping with the gradient norm, the
optimizer; xtrain's through the span hooks ``train_step`` offers a collector, transformers' around its calls),
reported per step as ``breakdown_ms``: where the step goes beyond the model's forward and backward.

Ends with one JSON line: speedup_vs_hf (xtrain tokens/s over transformers tokens/s, medians), its spread
(speedup_per_round_min_max: each round's ratio, min and max), each side's tokens/s and the spread of its rounds'
step times (min-max), then the configuration and the run's wall time.

Usage: python tools/bench/train_step.py [--nproc 2] [--pack-tokens 2048] [--packs-per-rank 1] [--rounds 7]
                                        [--docs packed|single] [--device cpu] [--profile] [--breakdown]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

AUX_LOSS_COEF = 0.001  # Qwen3-MoE's router_aux_loss_coef, on both sides
LR, WEIGHT_DECAY, BETAS, MAX_GRAD_NORM = 3e-3, 0.1, (0.9, 0.95), 1.0


def parse_args() -> argparse.Namespace:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--nproc", type=int, default=min(2, torch.cuda.device_count()) if cuda else 2)
    parser.add_argument("--model", default="debug", help="a size of xtrain.model.sizes")
    parser.add_argument("--pack-tokens", type=int, default=4096 if cuda else 2048)
    parser.add_argument("--packs-per-rank", type=int, default=1, help="micro-batches per rank per optimizer step")
    parser.add_argument("--mean-doc", type=int, default=400, help="mean document length in a packed row")
    parser.add_argument("--docs", choices=["packed", "single"], default="packed")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps of each side first")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps-per-round", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="print the top operators of one step of each side")
    parser.add_argument("--breakdown", action="store_true", help="wall time per phase of the timed steps (rank 0)")
    return parser.parse_args()


class PhaseTimes:
    """Wall time per phase, summed: what ``train_step`` calls on a collector (``span``, ``collective``), and
    ``phase`` for transformers' side. Only while ``enabled``."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self.enabled = False

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.enabled:
                self.ms[name] = self.ms.get(name, 0.0) + (time.perf_counter() - start) * 1e3

    def span(self, name: str, category: object) -> contextlib.AbstractContextManager[None]:
        return self.phase(name)

    def collective(self, name: str) -> contextlib.AbstractContextManager[None]:
        return self.phase(f"collective: {name}")


def document_lengths(pack_tokens: int, mean_doc: int, generator: torch.Generator) -> list[int]:
    """Lengths filling one row exactly: exponential with mean ``mean_doc`` (at least 8), the last one cut."""
    lengths: list[int] = []
    while sum(lengths) < pack_tokens:
        u = float(torch.rand((), generator=generator))
        lengths.append(max(8, int(-mean_doc * math.log(1.0 - u))))
    lengths[-1] -= sum(lengths) - pack_tokens
    return [n for n in lengths if n > 0]


def make_packs(args: argparse.Namespace, vocab: int, count: int) -> list[dict[str, Any]]:
    """``count`` packs: input ids [T], labels [T] (next token of the same document, else -100), lengths."""
    generator = torch.Generator().manual_seed(1234)
    packs = []
    for _ in range(count):
        if args.docs == "single":
            lengths = [args.pack_tokens]
        else:
            lengths = document_lengths(args.pack_tokens, args.mean_doc, generator)
        ids = torch.randint(0, vocab, (args.pack_tokens,), generator=generator)
        labels = torch.full_like(ids, -100)
        start = 0
        for length in lengths:
            labels[start : start + length - 1] = ids[start + 1 : start + length]
            start += length
        packs.append({"ids": ids, "labels": labels, "lengths": lengths})
    return packs


def write_shared_weights(model_name: str, folder: Path) -> None:
    """One set of weights for both sides: xtrain's own initialisation, written as a Hugging Face folder."""
    from xtrain.model.hf import save_hf
    from xtrain.model.transformer import Transformer

    model = Transformer(bench_config(model_name))
    model.init_weights(seed=0)
    save_hf(model, folder)


def bench_config(model_name: str) -> Any:
    from xtrain.model.sizes import model_config

    config = model_config(model_name)
    assert config.moe is not None, "the benchmark compares MoE models"
    return config.model_copy(update={"moe": config.moe.model_copy(update={"aux_loss_coef": AUX_LOSS_COEF})})


class XtrainSide:
    """xtrain's own path, as ``xtrain train`` sets it up (build.build_model, build_optimizer, train_step)."""

    name = "xtrain"

    def __init__(self, args: argparse.Namespace, folder: Path, device: torch.device, dtype: torch.dtype) -> None:
        from xtrain.config import OptimSection, ParallelSection
        from xtrain.loss import auto_chunk_tokens
        from xtrain.model.transformer import Transformer
        from xtrain.parallel.fsdp import apply_fsdp
        from xtrain.parallel.layout import check_layout
        from xtrain.parallel.materialize import materialize
        from xtrain.parallel.mesh import model_meshes
        from xtrain.train.optimizer import build_optimizer
        from xtrain.train.step import LossSettings

        config = bench_config(args.model)
        with torch.device("meta"):
            self.model = Transformer(config)
        world = torch.distributed.get_world_size()
        mesh = model_meshes(check_layout(ParallelSection(), world), device.type).dense
        apply_fsdp(self.model, mesh, param_dtype=dtype)
        materialize(self.model, device, seed=0, hf_path=folder)
        optim = OptimSection(lr=LR, weight_decay=WEIGHT_DECAY, betas=BETAS, max_grad_norm=MAX_GRAD_NORM)
        self.optimizer = build_optimizer(self.model, optim, device)
        self.settings = LossSettings(
            chunk_tokens=auto_chunk_tokens(config.vocab_size, dtype, device=device),
            aux_loss_coef=AUX_LOSS_COEF,
            z_loss_coef=config.moe.z_loss_coef,
            max_grad_norm=MAX_GRAD_NORM,
        )
        self.device, self.world = device, world
        self.phases = PhaseTimes()

    def step(self, mine: list[dict[str, Any]], target_tokens: int, routed_tokens: int) -> float:
        """One optimizer step over this rank's packs; returns the global cross-entropy."""
        from xtrain.model.documents import PackedDocuments
        from xtrain.train.step import GlobalBatch, MicroBatch, train_step

        batches = [
            MicroBatch(
                input_ids=pack["ids"].to(self.device).unsqueeze(0),
                labels=pack["labels"].to(self.device),
                documents=PackedDocuments.from_lengths(pack["lengths"], self.device),
            )
            for pack in mine
        ]
        result = train_step(
            self.model,
            self.optimizer,
            batches,
            GlobalBatch(target_tokens=target_tokens, routed_tokens=routed_tokens),
            self.settings,
            dp_size=self.world,
            collector=self.phases,  # type: ignore[arg-type]  # duck-typed: span() and collective() only
        )
        return result.loss


class HFSide:
    """transformers' Qwen3-MoE under FSDP2 in a plain PyTorch loop."""

    name = "hf"

    def __init__(self, args: argparse.Namespace, folder: Path, device: torch.device, dtype: torch.dtype) -> None:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from transformers import Qwen3MoeForCausalLM

        model = Qwen3MoeForCausalLM.from_pretrained(
            folder,
            attn_implementation="sdpa",
            dtype=torch.float32,
            output_router_logits=True,
            router_aux_loss_coef=AUX_LOSS_COEF,
        )
        model.config.use_cache = False
        model.to(device).train()
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        world = torch.distributed.get_world_size()
        mesh = torch.distributed.device_mesh.init_device_mesh(device.type, (world,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
            lr=LR,
            betas=BETAS,
            fused=device.type == "cuda",
        )
        self.model, self.device, self.world = model, device, world
        self.experts_implementation = model.config._experts_implementation
        self.phases = PhaseTimes()

    def step(self, mine: list[dict[str, Any]], target_tokens: int, routed_tokens: int) -> float:
        ce_share = torch.zeros((), dtype=torch.float64, device=self.device)
        for pack in mine:
            ids = pack["ids"].to(self.device).unsqueeze(0)
            labels = pack["labels"].to(self.device).unsqueeze(0)
            positions = torch.cat([torch.arange(n) for n in pack["lengths"]]).to(self.device).unsqueeze(0)
            # shift_labels: the labels are already aligned (and -100 at document ends), as xtrain's are;
            # num_items_in_batch: the global target count, so the loss is the global mean as on xtrain's side.
            with self.phases.phase("forward"):
                out = self.model(
                    input_ids=ids,
                    position_ids=positions,
                    labels=labels,
                    shift_labels=labels,
                    num_items_in_batch=target_tokens,
                )
            with self.phases.phase("backward"):
                (out.loss * self.world).backward()  # FSDP averages gradients over the ranks
            ce_share += (out.loss - AUX_LOSS_COEF * out.aux_loss).detach().double()
        with self.phases.phase("optimizer"):
            with self.phases.phase("collective: clip_grad_norm_"):
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), MAX_GRAD_NORM)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            with self.phases.phase("collective: all_reduce losses"):
                torch.distributed.all_reduce(ce_share)
        return float(ce_share)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rank_main(  # noqa: PLR0917 (torch.multiprocessing passes these positionally)
    rank: int, world: int, port: int, folder: str, args: argparse.Namespace, out: str
) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if args.device == "cpu":
        torch.set_num_threads(1)  # one core per rank, as OMP_NUM_THREADS=1 would give
    from xtrain.parallel.distributed import close_distributed, init_distributed

    ctx = init_distributed(args.device)
    dtype = torch.bfloat16 if ctx.device.type == "cuda" else torch.float32
    sides = [XtrainSide(args, Path(folder), ctx.device, dtype), HFSide(args, Path(folder), ctx.device, dtype)]
    vocab = sides[0].model.config.vocab_size
    per_step = world * args.packs_per_rank
    # Distinct global batches for the steps of a round, then reused round after round (the same for both sides).
    packs = make_packs(args, vocab, per_step * args.steps_per_round)
    batches = [packs[i * per_step : (i + 1) * per_step] for i in range(args.steps_per_round)]

    def run(side: XtrainSide | HFSide, batch: list[dict[str, Any]]) -> float:
        mine = batch[rank * args.packs_per_rank : (rank + 1) * args.packs_per_rank]
        target = sum(int((p["labels"] != -100).sum()) for p in batch)
        return side.step(mine, target, routed_tokens=per_step * args.pack_tokens)

    # Same weights, same first batch: the same cross-entropy, or the sides do not compute the same thing.
    first_ce = {side.name: run(side, batches[0]) for side in sides}
    for _ in range(args.warmup - 1):
        for side in sides:
            for batch in batches:
                run(side, batch)
    times: dict[str, list[float]] = {side.name: [] for side in sides}
    for side in sides:
        side.phases.enabled = args.breakdown
    for round_index in range(args.rounds):
        for side in sides if round_index % 2 == 0 else sides[::-1]:
            synchronize(ctx.device)
            torch.distributed.barrier()
            start = time.perf_counter()
            for batch in batches:
                run(side, batch)
            synchronize(ctx.device)
            torch.distributed.barrier()
            times[side.name].append((time.perf_counter() - start) / len(batches))
        if rank == 0:
            print(f"round {round_index}: " + ", ".join(f"{k} {v[-1]:.3f} s/step" for k, v in times.items()), flush=True)
    timed_steps = args.rounds * len(batches)
    breakdown = {side.name: {k: round(v / timed_steps, 2) for k, v in side.phases.ms.items()} for side in sides}
    for side in sides:
        side.phases.enabled = False
    profile = {}
    if args.profile:
        profile = {side.name: profile_step(side, lambda s=side: run(s, batches[0]), rank) for side in sides}
    if rank == 0:
        result = {
            "times": times,
            "first_ce": first_ce,
            "experts_impl_hf": sides[1].experts_implementation,
            "attention_backend_xtrain": sides[0].model.attention_backend,
            "profile": profile,
            "breakdown_ms": breakdown,
            "tokens_per_step": per_step * args.pack_tokens,
        }
        Path(out).write_text(json.dumps(result))
    close_distributed()


def profile_step(side: XtrainSide | HFSide, step: Any, rank: int) -> list[list[Any]]:
    """One step under the profiler: the top operators by self CPU time on this rank, [name, ms, calls]."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total_ms = sum(e.self_cpu_time_total for e in rows) / 1e3
    top = [[e.key, round(e.self_cpu_time_total / 1e3, 2), e.count] for e in rows[:15]]
    if rank == 0:
        print(f"== profile of one {side.name} step on rank 0: {total_ms:.1f} ms of self CPU time in operators")
        for name, ms, count in top:
            print(f"  {ms:9.2f} ms  {count:6d}x  {name}")
    return top


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> None:
    started = time.perf_counter()
    args = parse_args()
    if args.device == "cpu":
        os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the spawned ranks before torch starts there
    with tempfile.TemporaryDirectory(prefix="train-step-bench-") as tmp:
        folder, out = Path(tmp, "hf"), Path(tmp, "result.json")
        write_shared_weights(args.model, folder)
        mp.start_processes(
            rank_main,
            args=(args.nproc, free_port(), str(folder), args, str(out)),
            nprocs=args.nproc,
            start_method="spawn",
        )
        result = json.loads(out.read_text())
    median = {name: statistics.median(t) for name, t in result["times"].items()}
    tokens_per_s = {name: result["tokens_per_step"] / m for name, m in median.items()}
    ce = result["first_ce"]
    per_round = [h / x for h, x in zip(result["times"]["hf"], result["times"]["xtrain"], strict=True)]
    figures = {
        "speedup_vs_hf": round(tokens_per_s["xtrain"] / tokens_per_s["hf"], 3),
        "xtrain_tokens_per_s": round(tokens_per_s["xtrain"], 1),
        "hf_tokens_per_s": round(tokens_per_s["hf"], 1),
        "xtrain_step_s": round(median["xtrain"], 4),
        "hf_step_s": round(median["hf"], 4),
        # The spread: each round's ratio (the two sides timed back to back in that round).
        "speedup_per_round_min_max": [round(min(per_round), 3), round(max(per_round), 3)],
        "xtrain_step_s_min_max": [round(min(result["times"]["xtrain"]), 4), round(max(result["times"]["xtrain"]), 4)],
        "hf_step_s_min_max": [round(min(result["times"]["hf"]), 4), round(max(result["times"]["hf"]), 4)],
        "first_step_ce": [ce["xtrain"], ce["hf"]],
        "first_step_ce_rel_diff": float(f"{abs(ce['xtrain'] - ce['hf']) / abs(ce['hf']):.3g}"),
        "rounds": args.rounds,
        "steps_per_round": args.steps_per_round,
        "nproc": args.nproc,
        "device": args.device,
        "model": args.model,
        "tokens_per_step": result["tokens_per_step"],
        "pack_tokens": args.pack_tokens,
        "docs": args.docs,
        "mean_doc": args.mean_doc if args.docs == "packed" else args.pack_tokens,
        "attention_xtrain": result["attention_backend_xtrain"],
        "experts_impl_hf": result["experts_impl_hf"],
        **({"breakdown_ms": result["breakdown_ms"]} if args.breakdown else {}),
        "wall_s": round(time.perf_counter() - started, 1),
        "torch": torch.__version__,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    sys.exit(main())
