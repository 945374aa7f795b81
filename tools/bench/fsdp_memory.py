"""Training-state memory per rank under xtrain's FSDP2 sharding, at 1, 2 and 4 processes.

The model is Qwen3-MoE-shaped and small enough for a laptop (default: 4 layers, hidden 512, 16 experts of
hidden 384, top-2, vocabulary 32,768, untied: 74.5 M parameters, 96 % of them in experts and embeddings), so that
parameters, gradients and optimizer state dominate its memory. At each process count (gloo, spawned processes)
the model is set up exactly as ``xtrain train`` does it (meta device → ``apply_fsdp`` → ``materialize`` →
``build_optimizer``), then trained for one real step (forward through ``forward_with_head`` with the chunked
loss on one pack of 256 tokens, backward, ``optimizer.step()``); then each rank counts the bytes it holds:

- parameters: ``p.to_local()`` of every DTensor parameter (the rank's shard),
- gradients: ``p.grad.to_local()``,
- optimizer state: every tensor in ``optimizer.state`` (AdamW's exp_avg and exp_avg_sq shards, and its ``step``,
  a scalar tensor per parameter that is not sharded),
- and, beside those logical bytes, the bytes of the storages behind the parameter and gradient shards
  (``untyped_storage().nbytes()``), which include FSDP2's padding.

Where an excess over 1/N comes from: FSDP2 shards each parameter on dim 0 in ``torch.chunk`` fashion, so a dim 0
that N does not divide gives the first ranks ceil(d0/N) rows and leaves the last ones fewer; and it allocates
every rank's shard padded to ceil(d0/N) rows (the storage figure), so the padding is memory every rank holds.
AdamW's per-parameter ``step`` scalars are replicated. With this model's dims (all divisible by 4) the padding
is zero and the step scalars are 188 bytes, so the ratio is 1/N to within 1e-6;
``--vocab 32001`` or an expert count that N does not divide shows the padding.

Ends with one JSON line: per_rank_ratio {"2": .., "4": ..}, the largest rank's total at N over the total at 1
(target: within 5 % of 1/N), then per process count the largest rank's parameter / gradient / optimizer /
padding bytes and the ratio of the padded storage.

Usage: python tools/bench/fsdp_memory.py [--procs 1,2,4] [--vocab 32768] [--experts 16] [--layers 4]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import Tensor


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--procs", default="1,2,4", help="process counts; the first is the baseline")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--expert-hidden", type=int, default=384)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--tokens", type=int, default=256, help="tokens of the one training pack")
    return parser.parse_args()


def model_config(args: argparse.Namespace) -> Any:
    from xtrain.model.sizes import model_config as named

    base = named("debug")
    assert base.moe is not None
    return base.model_copy(
        update={
            "vocab_size": args.vocab,
            "hidden_size": args.hidden,
            "num_layers": args.layers,
            "num_attention_heads": 8,
            "num_kv_heads": 4,
            "head_dim": 64,
            "intermediate_size": 4 * args.hidden,
            "moe": base.moe.model_copy(
                update={"num_experts": args.experts, "moe_intermediate_size": args.expert_hidden}
            ),
            "mlp_only_layers": (),
        }
    )


def local(tensor: Tensor) -> Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def nbytes(tensor: Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def storage_bytes(tensors: list[Tensor]) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from xtrain.config import OptimSection, ParallelSection
    from xtrain.loss import chunked_cross_entropy
    from xtrain.model.documents import PackedDocuments
    from xtrain.model.transformer import Transformer
    from xtrain.parallel.distributed import close_distributed, init_distributed
    from xtrain.parallel.fsdp import apply_fsdp
    from xtrain.parallel.layout import check_layout
    from xtrain.parallel.materialize import materialize
    from xtrain.parallel.mesh import model_meshes
    from xtrain.train.optimizer import build_optimizer

    ctx = init_distributed("cpu")
    with torch.device("meta"):
        model = Transformer(model_config(args))
    apply_fsdp(model, model_meshes(check_layout(ParallelSection(), world), "cpu").dense, param_dtype=torch.float32)
    materialize(model, ctx.device, seed=0)
    optimizer = build_optimizer(model, OptimSection(), ctx.device)

    # One real step, so that gradients and AdamW's state exist (the same pack on every rank).
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (1, args.tokens), generator=generator)
    labels = torch.roll(ids[0], -1)
    documents = PackedDocuments.from_lengths([args.tokens], ctx.device)

    def head(hidden_TD: Tensor, weight_VD: Tensor) -> Tensor:
        return chunked_cross_entropy(hidden_TD, weight_VD, labels, normaliser=args.tokens * world, chunk_tokens=128)

    loss, _ = model.forward_with_head(ids, documents=documents, head=head)
    (loss * world).backward()
    optimizer.step()

    params = [local(p) for p in model.parameters()]
    grads = [local(p.grad) for p in model.parameters() if p.grad is not None]
    state = [local(t) for s in optimizer.state.values() for t in s.values() if isinstance(t, Tensor)]
    figures = {
        "params": sum(map(nbytes, params)),
        "grads": sum(map(nbytes, grads)),
        "optimizer": sum(map(nbytes, state)),
        # The storages behind the shards: FSDP2's padded allocations (one storage may back several gradients).
        "params_storage": storage_bytes(params),
        "grads_storage": storage_bytes(grads),
        "num_params": sum(p.numel() for p in model.parameters()),
    }
    Path(out, f"rank-{rank}.json").write_text(json.dumps(figures))
    close_distributed()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def measure(world: int, args: argparse.Namespace) -> list[dict[str, int]]:
    with tempfile.TemporaryDirectory(prefix="fsdp-memory-") as out:
        mp.start_processes(rank_main, args=(world, free_port(), args, out), nprocs=world, start_method="spawn")
        return [json.loads(Path(out, f"rank-{r}.json").read_text()) for r in range(world)]


def main() -> None:
    args = parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    counts = [int(n) for n in args.procs.split(",")]
    per_count: dict[str, Any] = {}
    for world in counts:
        ranks = measure(world, args)
        largest = max(ranks, key=lambda r: r["params"] + r["grads"] + r["optimizer"])
        padded = max(r["params_storage"] + r["grads_storage"] + r["optimizer"] for r in ranks)
        per_count[str(world)] = {
            "total": largest["params"] + largest["grads"] + largest["optimizer"],
            "total_padded": padded,
            **{key: largest[key] for key in ("params", "grads", "optimizer")},
            "padding": padded - (largest["params"] + largest["grads"] + largest["optimizer"]),
            "num_params": largest["num_params"],
        }
        print(f"{world} process(es): {per_count[str(world)]}", flush=True)
    base = per_count[str(counts[0])]
    ratio = {n: round(c["total"] / base["total"], 6) for n, c in per_count.items() if n != str(counts[0])}
    padded = {
        n: round(c["total_padded"] / base["total_padded"], 6) for n, c in per_count.items() if n != str(counts[0])
    }
    figures = {
        "per_rank_ratio": ratio,
        "per_rank_ratio_padded": padded,
        "off_1_over_n_pct": {n: round((r * int(n) - 1) * 100, 4) for n, r in ratio.items()},
        "bytes": per_count,
        "model": {k: getattr(args, k) for k in ("layers", "hidden", "experts", "expert_hidden", "vocab")},
        "torch": torch.__version__,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    sys.exit(main())
