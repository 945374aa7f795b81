"""Checkpoint cost: how long the training loop is blocked by a save, synchronous against asynchronous, and the
load time, through xtrain's own checkpoint code (``xtrain.train.checkpoint``) in N processes (default 2; gloo
on the CPU, one thread each).

The model is the debug model's shape scaled up (``--hidden``, ``--layers``, ``--experts``, ``--vocab``; the
defaults give about 75 M parameters, 300 MB of fp32 weights, and a checkpoint of about 900 MB with AdamW's two
moments), sharded with FSDP2, with optimizer state created by one AdamW step. For each mode, ``--saves`` saves
into a fresh run directory under ``--dir`` (default: a temporary folder, removed at the end):

- ``sync_stall_s``: median time ``Checkpointer.save`` blocks (state dict, planning, writing every file, marker);
- ``async_stall_s``: median time it blocks with ``checkpoint.async`` (state dict, planning, copy to host
  memory); the write then runs in the background and is waited for, untimed, before the next save;
- ``stall_ratio``: async over sync (target ≤ 0.2);
- ``load_s``: median time to load the last checkpoint into the sharded model and optimizer (DCP read,
  resharding, ``set_state_dict``).

Times are rank 0's, each between barriers. Prints one JSON line with these and the configuration.

Usage: python tools/bench/checkpoint.py [--nproc 2] [--saves 3] [--dir DIR] [--hidden 768] [--layers 6]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _rank(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(args.nproc),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(args.nproc),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import torch
    import torch.distributed as dist
    from xtrain.config import CheckpointSection, OptimSection, ParallelSection
    from xtrain.model.sizes import model_config
    from xtrain.model.transformer import Transformer
    from xtrain.parallel.distributed import close_distributed, init_distributed
    from xtrain.parallel.fsdp import apply_fsdp
    from xtrain.parallel.layout import check_layout
    from xtrain.parallel.materialize import materialize
    from xtrain.parallel.mesh import model_meshes
    from xtrain.train.checkpoint.compat import saved_shapes
    from xtrain.train.checkpoint.parts import ModelPart, OptimizerPart, RngPart
    from xtrain.train.checkpoint.resume import load_device_state
    from xtrain.train.checkpoint.saver import Checkpointer, RunIdentity
    from xtrain.train.checkpoint.train_state import Counters, TrainState
    from xtrain.train.optimizer import build_optimizer

    torch.set_num_threads(1)
    ctx = init_distributed("cpu")
    base = model_config("debug")
    assert base.moe is not None
    shape = base.model_copy(
        update={
            "hidden_size": args.hidden,
            "num_layers": args.layers,
            "vocab_size": args.vocab,
            "intermediate_size": 3 * args.hidden,
            "num_attention_heads": args.hidden // 64,
            "num_kv_heads": 2,
            "head_dim": 64,
            "moe": base.moe.model_copy(update={"num_experts": args.experts, "moe_intermediate_size": args.hidden // 2}),
        }
    )
    with torch.device("meta"):
        model = Transformer(shape)
    apply_fsdp(
        model,
        model_meshes(check_layout(ParallelSection(), ctx.world_size), "cpu").dense,
        param_dtype=torch.float32,
        reshard_after_forward=True,
        prefetch=False,
    )
    materialize(model, ctx.device, seed=0)
    optimizer = build_optimizer(model, OptimSection(), ctx.device)
    for parameter in model.parameters():
        parameter.grad = torch.full_like(parameter, 1e-3)
    optimizer.step()  # AdamW's moments exist from here on: they are most of a checkpoint
    optimizer.zero_grad(set_to_none=True)
    parameters = sum(p.numel() for p in model.parameters())

    def timed(action: Any) -> float:
        dist.barrier()
        started = time.perf_counter()
        action()
        dist.barrier()
        return time.perf_counter() - started

    class DeviceParts:
        """What the checkpointer saves: the trainer's device parts; no schedule or data in this benchmark."""

        def __init__(self) -> None:
            self.rng = RngPart(ctx.rank, ctx.device)
            self.tensors = {"model": ModelPart(model), "optim": OptimizerPart(model, optimizer), "rng": self.rng}

        def device_state(self) -> dict[str, Any]:
            return dict(self.tensors)

        def host_state(self) -> TrainState:
            return TrainState(schedule={}, data={}, counters=Counters())

    parts = DeviceParts()
    identity = RunIdentity(
        world_size=ctx.world_size, replicate=1, config_toml="", model_config=shape.model_dump(mode="json")
    )
    figures: dict[str, Any] = {}
    root = Path(args.dir)
    last_folder = None
    for mode in ("sync", "async"):
        run_dir = root / mode
        checkpointer = Checkpointer(
            CheckpointSection(every_steps=1, keep=1, async_save=mode == "async"),
            run_dir,
            parts,
            identity,
            collector=None,
        )
        stalls = []
        for step in range(1, args.saves + 1):
            dist.barrier()
            stalls.append(checkpointer.save(step))  # the loop's blocked time, per rank
            checkpointer.close()  # untimed: the background write, before the next save
            dist.barrier()
        figures[f"{mode}_stall_s"] = statistics.median(stalls)
        figures[f"{mode}_stalls_s"] = stalls
        last_folder = run_dir / "checkpoints" / f"step-{args.saves}"
    assert last_folder is not None
    keys = set(saved_shapes(last_folder))
    loads = [timed(lambda: load_device_state(last_folder, parts, keys)) for _ in range(args.saves)]
    figures["load_s"] = statistics.median(loads)
    figures["loads_s"] = loads
    if ctx.rank == 0:
        size = sum(f.stat().st_size for f in last_folder.iterdir())
        figures.update(parameters=parameters, weights_bytes=4 * parameters, checkpoint_bytes=size)
        Path(out).write_text(json.dumps(figures))
    close_distributed()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="where the checkpoints go (default: a temporary folder)")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    import torch.multiprocessing as mp

    owned = args.dir is None
    args.dir = Path(tempfile.mkdtemp(prefix="xtrain-ckpt-bench-")) if owned else args.dir
    out = args.dir / "figures.json"
    try:
        mp.start_processes(  # type: ignore[attr-defined,no-untyped-call]  # torch.multiprocessing is untyped
            _rank, args=(args, _free_port(), str(out)), nprocs=args.nproc, start_method="spawn"
        )
        figures = json.loads(out.read_text())
    finally:
        if owned:
            shutil.rmtree(args.dir, ignore_errors=True)
    result = {
        "sync_stall_s": figures["sync_stall_s"],
        "async_stall_s": figures["async_stall_s"],
        "stall_ratio": figures["async_stall_s"] / figures["sync_stall_s"],
        "load_s": figures["load_s"],
        **{k: v for k, v in figures.items() if k not in {"sync_stall_s", "async_stall_s", "load_s"}},
        "nproc": args.nproc,
        "saves": args.saves,
        "model": {"hidden": args.hidden, "layers": args.layers, "experts": args.experts, "vocab": args.vocab},
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
