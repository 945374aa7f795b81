"""Activation memory and step time of one training step for memory.checkpointing = none, full, and full with
memory.offload, side by side on the same model and pack.

Model: 8 decoder layers shaped like a small Qwen3-MoE (layer 0 dense, the others 8 experts top-2); one pack of
16,384 tokens (CPU; 65,536 on CUDA) holding documents of 2,048 tokens; fp32 on the CPU, bf16 on CUDA. Each mode
applies xtrain's own apply_activation_checkpointing / apply_activation_offload to a copy of the same model.

What is measured:
- saved_bytes: the bytes the device allocator holds at the end of forward above what it held before it: exactly
  the activations kept for backward (plus the scalar loss). On CUDA from torch.cuda.memory_allocated; on the CPU
  from the PyTorch profiler's allocation events. Offloaded checkpoints live in host buffers outside the device
  allocator (pinned memory on CUDA; on the CPU a pool that does not go through PyTorch's allocator), so they are
  not counted: what is counted is what stays on the device.
- peak_bytes: the peak over the whole forward+backward above the starting level (recompute included).
- step_s: forward+backward wall time, the modes interleaved round by round (the order rotating), median over
  the rounds, so the drift of a shared machine hits every mode alike.

Ends with one JSON line:
  full_over_none      saved_bytes(full) / saved_bytes(none)
  offload_over_none   saved_bytes(full + offload) / saved_bytes(none)
  offload_time_ratio  step_s(full + offload) / step_s(full)
  offload_time_ratio_range  [min, max] of the rounds' own ratios (the two modes of a round run back to back)
plus every raw figure (each mode's step_s_range: its rounds' min and max). The memory figures are the same in
every round (allocations do not depend on timing), so they have no spread.

Usage: python tools/bench/activation_memory.py [--tokens 16384] [--doc-tokens 2048] [--layers 8] [--rounds 3]
                                               [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile
from xtrain.loss import chunked_cross_entropy, peak_allocated_bytes
from xtrain.model.config import ModelConfig
from xtrain.model.moe import MoEConfig
from xtrain.model.transformer import Transformer
from xtrain.parallel.checkpointing import apply_activation_checkpointing
from xtrain.parallel.offload import apply_activation_offload

MODES = ("none", "full", "full+offload")


def model_config(layers: int, cuda: bool) -> ModelConfig:
    hidden = 1024 if cuda else 128  # small on the CPU: a step at 16k tokens stays within seconds on 2 cores
    return ModelConfig(
        vocab_size=8192 if cuda else 2048,
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=8 if cuda else 4,
        num_kv_heads=4 if cuda else 2,
        head_dim=128 if cuda else 32,
        intermediate_size=hidden * 3,
        mlp_only_layers=(0,),
        moe=MoEConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=hidden // 2, norm_topk_prob=True),
    )


def build(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> Transformer:
    with torch.device("meta"):
        model = Transformer(config)
    model.to_empty(device=device)
    model.init_weights(0)
    return model.to(dtype)


def prepared(base: Transformer, mode: str, device: torch.device) -> Transformer:
    model = copy.deepcopy(base)
    if mode != "none":
        apply_activation_checkpointing(model, "full")
    if mode == "full+offload":
        apply_activation_offload(model, device)
    return model


def held_after(fn: Callable[[], Any], device: torch.device) -> tuple[int, Any]:
    """Bytes the device allocator holds after ``fn()`` above before it, and fn's result (kept alive)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        result = fn()
        torch.cuda.synchronize(device)
        return torch.cuda.memory_allocated(device) - start, result
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events: Any = prof.profiler.kineto_results  # type: ignore[union-attr]
    held = sum(
        int(e.nbytes()) for e in events.events() if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")
    )
    return held, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", type=int)
    parser.add_argument("--doc-tokens", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    tokens = args.tokens or (65_536 if cuda else 16_384)
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)

    config = model_config(args.layers, cuda)
    base = build(config, device, dtype)
    input_ids = torch.randint(0, config.vocab_size, (1, tokens), device=device)
    labels = torch.roll(input_ids[0], -1)
    bounds = [*range(0, tokens, args.doc_tokens), tokens]
    cu_seqlens = torch.tensor(bounds, dtype=torch.int32, device=device)

    def loss_of(model: Transformer) -> torch.Tensor:
        def head(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            return chunked_cross_entropy(hidden, weight, labels, normaliser=float(tokens), chunk_tokens=4096)

        loss, _stats = model.forward_with_head(input_ids, cu_seqlens, head=head)
        return loss

    models = {mode: prepared(base, mode, device) for mode in MODES}
    figures: dict[str, dict[str, float]] = {}
    for mode, model in models.items():
        loss_of(model).backward()  # warm-up: imports, host buffers, gradients allocated
        saved, loss = held_after(lambda model=model: loss_of(model), device)
        loss.backward()
        peak = peak_allocated_bytes(lambda model=model: loss_of(model).backward(), device)
        figures[mode] = {"saved_bytes": saved, "peak_bytes": peak}

    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for round_index in range(args.rounds):
        order = MODES[round_index % len(MODES) :] + MODES[: round_index % len(MODES)]
        for mode in order:
            if cuda:
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            loss_of(models[mode]).backward()
            if cuda:
                torch.cuda.synchronize(device)
            times[mode].append(time.perf_counter() - started)
    for mode in MODES:
        figures[mode]["step_s"] = statistics.median(times[mode])
        figures[mode]["step_s_range"] = [min(times[mode]), max(times[mode])]
        print(f"{mode:>13}: {figures[mode]}", flush=True)

    none, full, offload = (figures[mode] for mode in MODES)
    # The spread: each round's offload / full ratio (the two modes of a round ran back to back).
    ratios = [with_offload / plain for with_offload, plain in zip(times[MODES[2]], times[MODES[1]], strict=True)]
    print(
        json.dumps(
            {
                "full_over_none": round(full["saved_bytes"] / none["saved_bytes"], 4),
                "offload_over_none": round(offload["saved_bytes"] / none["saved_bytes"], 4),
                "offload_time_ratio": round(offload["step_s"] / full["step_s"], 4),
                "offload_time_ratio_range": [round(min(ratios), 4), round(max(ratios), 4)],
                "modes": figures,
                "tokens": tokens,
                "layers": args.layers,
                "dtype": str(dtype).removeprefix("torch."),
                "device": str(device),
                "date": datetime.date.today().isoformat(),
                "machine": platform.node(),
            }
        )
    )


if __name__ == "__main__":
    main()
