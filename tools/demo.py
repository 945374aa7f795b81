"""`make demo`: train the tiny `debug` MoE model for a few steps on two CPU processes, then analyse the run.

What is real here: the xtrain model (the one the parity tests check against transformers), the global-batch
load-balancing loss, two processes on a gloo process group exchanging gradients and router counts, and a run
directory written through deeptrace's RunWriter and span Collector, analysed by `deeptrace analyze`.

What is NOT built yet, and said so when the demo runs: xtrain's FSDP2 trainer (`xtrain train`, with sharding,
chunked loss, activation offload, balanced packing and DCP checkpoints). Until it lands, this script stands in with
a plain data-parallel loop (full replicas, gradients all-reduced), tokenising the sample documents byte by byte.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_DATA = REPO_ROOT / "tools" / "demo_data" / "sample.jsonl"
BYTE_VOCAB = 256  # token ids 0..255 are UTF-8 bytes; END_OF_DOCUMENT ends each document
END_OF_DOCUMENT = 256


def load_documents(path: Path) -> list[list[int]]:
    """Byte-level token ids of each document, each ending with END_OF_DOCUMENT."""
    documents = []
    for line_no, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            text = json.loads(line)["text"]
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise SystemExit(f"{path}:{line_no}: expected a JSON object with a 'text' field ({error})") from None
        documents.append([*text.encode(), END_OF_DOCUMENT])
    return documents


def pack_rows(documents: list[list[int]], row_tokens: int) -> list[tuple[list[int], list[int]]]:
    """Greedy packing of whole documents into rows of at most `row_tokens`: (token ids, document lengths)."""
    rows: list[tuple[list[int], list[int]]] = []
    tokens: list[int] = []
    lengths: list[int] = []
    for document in documents:
        kept = document[:row_tokens]
        if len(tokens) + len(kept) > row_tokens:
            rows.append((tokens, lengths))
            tokens, lengths = [], []
        tokens += kept
        lengths.append(len(kept))
    if tokens:
        rows.append((tokens, lengths))
    return rows


def train_rank(rank: int, world_size: int, run_dir: Path, steps: int, row_tokens: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from deeptrace.collect import Collector
    from deeptrace.rundir import RunWriter
    from deeptrace.spans import Category
    from xtrain.model.flops import training_flops_per_token
    from xtrain.model.moe.aux_loss import load_balancing_loss
    from xtrain.model.sizes import model_config
    from xtrain.model.transformer import Transformer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{run_dir / '.rendezvous'}", rank=rank, world_size=world_size)
    config = model_config("debug")
    assert config.moe is not None
    aux_coef = 0.01
    torch.manual_seed(0)  # the same initial replica on every rank
    model = Transformer(config)
    model.init_weights()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    rows = pack_rows(load_documents(SAMPLE_DATA), row_tokens)

    writer = RunWriter(run_dir, rank, world_size)
    collector = Collector(run_dir, rank, world_size)
    if rank == 0:
        all_lengths = [length for _, lengths in rows for length in lengths]
        writer.write_meta(
            versions={"torch": torch.__version__},
            model_flops_per_token=training_flops_per_token(config, all_lengths),
            extras={"model": "debug", "attention_backend": model.attention_backend, "stand_in_loop": True},
        )
        writer.write_config_toml(
            f'model = "debug"\nsteps = {steps}\nrow_tokens = {row_tokens}\nworld_size = {world_size}\n'
            f"lr = 3e-3\naux_loss_coef = {aux_coef}\n"
        )

    def all_reduce(tensor: torch.Tensor, name: str) -> None:
        with collector.collective(name, group="dp", nbytes=tensor.numel() * tensor.element_size()):
            dist.all_reduce(tensor)

    def all_reduce_grads(params: list[torch.nn.Parameter], name: str) -> None:
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        all_reduce(flat, name)
        for grad, reduced in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
            grad.copy_(reduced.view_as(grad))

    for step in range(1, steps + 1):
        collector.step_begin(step)
        started = time.perf_counter()
        with collector.span("data", Category.DATA):
            tokens, lengths = rows[((step - 1) * world_size + rank) % len(rows)]
            ids = torch.tensor(tokens).unsqueeze(0)
            cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
            # Next-token targets within each document; the last token of a document predicts nothing.
            targets = torch.roll(ids[0], -1)
            targets[cu_seqlens[1:].long() - 1] = -100
        target_tokens = torch.tensor([float((targets != -100).sum())])
        all_reduce(target_tokens, "target_count")  # the loss is a mean over the targets of the global batch
        with collector.span("forward", Category.COMPUTE):
            out = model.forward_hidden(ids, cu_seqlens)
            logits = F.linear(out.hidden[0], model.output_projection_weight)
            ce_sum = F.cross_entropy(logits.float(), targets, ignore_index=-100, reduction="sum")
        # The load-balancing loss sees the router counts of the global batch, not this rank's alone.
        counts = torch.stack([s.tokens_per_expert for s in out.router_stats]).float()
        all_reduce(counts, "router_counts")
        routed_tokens = torch.tensor([float(len(tokens))])
        all_reduce(routed_tokens, "routed_count")
        aux = load_balancing_loss(out.router_stats, counts, routed_tokens[0])
        loss = ce_sum / target_tokens[0] + aux_coef * aux
        with collector.span("backward", Category.COMPUTE):
            loss.backward()
        # One all-reduce per layer and one for the rest, as a bucketed data-parallel wrapper would do it.
        for index, layer in enumerate(model.layers):
            all_reduce_grads(list(layer.parameters()), f"all_reduce_grads_layer{index}")
        all_reduce_grads(
            [p for name, p in model.named_parameters() if not name.startswith("layers.")], "all_reduce_grads_rest"
        )
        with collector.span("optimizer", Category.OPTIMIZER):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        ce_total = ce_sum.detach().reshape(1)
        all_reduce(ce_total, "loss_sum")
        step_time = time.perf_counter() - started
        collector.step_end(step)
        writer.append_rank_record(step, step_time_s=step_time, tokens=len(tokens))
        if rank == 0:
            global_targets = float(target_tokens[0])
            writer.append_metrics(
                step,
                loss=float(ce_total[0]) / global_targets,
                aux_loss=float(aux.detach()) * world_size,
                tokens=int(routed_tokens[0]),
                tokens_per_s=float(routed_tokens[0]) / step_time,
                step_time_s=step_time,
            )
            print(
                f"step {step:3d}  loss {float(ce_total[0]) / global_targets:.4f}  {step_time * 1000:.0f} ms", flush=True
            )
    collector.close()
    writer.close()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=REPO_ROOT / "runs" / "demo")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--row-tokens", type=int, default=512)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()

    import torch.multiprocessing as mp

    print(f"xtrain demo: tiny MoE model ('debug'), CPU, gloo, {args.world_size} processes")
    print("Not built yet: the FSDP2 trainer (`xtrain train`); a plain data-parallel loop stands in for it.")
    if args.run_dir.exists():
        shutil.rmtree(args.run_dir)
    args.run_dir.mkdir(parents=True)
    mp.start_processes(
        train_rank,
        args=(args.world_size, args.run_dir, args.steps, args.row_tokens),
        nprocs=args.world_size,
        start_method="spawn",
    )
    (args.run_dir / ".rendezvous").unlink(missing_ok=True)
    print(f"\nrun directory: {args.run_dir}\n\n$ deeptrace analyze {args.run_dir}", flush=True)
    deeptrace = Path(sys.executable).parent / "deeptrace"
    env = {**os.environ, "COLUMNS": os.environ.get("COLUMNS", "120")}
    return subprocess.run([str(deeptrace), "analyze", str(args.run_dir)], env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
