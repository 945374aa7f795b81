"""Loss forward+backward: the naive full-logits cross-entropy against xtrain's chunked loss, side by side.

Shape (issue 8, part 7): 4096 tokens, vocabulary 151,936, hidden 1024, fp32 on the CPU; on CUDA, when present,
16,384 tokens, hidden 4096, bf16 (override with the flags). Both sides see the same hidden states, output weight
and labels (1 in 16 labels is ignore_index), and the same normaliser (the number of target tokens).

What is measured:
- peak memory: the increase over the memory held once the hidden states and output weight exist (their
  gradients start as None, so both sides' gradient tensors are counted), during one forward+backward. On CUDA
  from the allocator's statistics; on the CPU from the PyTorch profiler's allocation events (every allocation
  and free through PyTorch's CPU allocator, summed in time order: exactly the bytes of live tensors, whatever
  malloc does with freed pages). See xtrain.loss.peak_memory. This profiled step also gives the losses and
  gradients that are compared.
- time: forward+backward wall time, the two sides interleaved round by round (alternating which goes first)
  so that the drift of a shared machine hits both alike; the figure is the median over the rounds.

Ends with one JSON line:
  peak_ratio        chunked peak / naive peak                    (target <= 0.12; floor ~0.083 = weight grad)
  time_ratio        chunked median time / naive median time      (target <= 1.0); time_ratio_min_max: the
                    rounds' own ratios, min and max
  max_grad_rel_err  max over hidden and weight of max|g_chunked - g_naive| / max|g_naive|
plus the raw figures (peaks in bytes, times in seconds, loss difference, chunk size, the weight-gradient floor).

Usage: python tools/bench/chunk_loss.py [--tokens 4096] [--vocab 151936] [--hidden 1024] [--dtype float32]
                                       [--chunk-tokens auto] [--rounds 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor
from xtrain.loss import auto_chunk_tokens, chunked_cross_entropy, full_logits_cross_entropy, peak_allocated_bytes

IGNORE_INDEX = -100
LossFn = Callable[[Tensor, Tensor, Tensor, float], Tensor]


def parse_args() -> argparse.Namespace:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--tokens", type=int, default=16384 if cuda else 4096)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=4096 if cuda else 1024)
    parser.add_argument("--dtype", default="bfloat16" if cuda else "float32", choices=["float32", "bfloat16"])
    parser.add_argument("--chunk-tokens", default="auto", help='"auto" (xtrain.loss.auto_chunk_tokens) or a number')
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds, each running both sides once")
    return parser.parse_args()


def make_inputs(args: argparse.Namespace) -> tuple[Tensor, Tensor, Tensor, float]:
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    hidden_TD = torch.randn(args.tokens, args.hidden, generator=gen).to(device, dtype).requires_grad_()
    # Output-projection scale of a trained model: logits of a few units, so the softmax is neither flat nor one-hot.
    weight_VD = (torch.randn(args.vocab, args.hidden, generator=gen) * 0.05).to(device, dtype).requires_grad_()
    labels_T = torch.randint(0, args.vocab, (args.tokens,), generator=gen)
    labels_T[::16] = IGNORE_INDEX
    labels_T = labels_T.to(device)
    normaliser = float((labels_T != IGNORE_INDEX).sum())
    return hidden_TD, weight_VD, labels_T, normaliser


def step(loss_fn: LossFn, hidden_TD: Tensor, weight_VD: Tensor, labels_T: Tensor, normaliser: float) -> Tensor:
    """One forward+backward from fresh gradients; returns the detached loss."""
    hidden_TD.grad = None
    weight_VD.grad = None
    loss = loss_fn(hidden_TD, weight_VD, labels_T, normaliser)
    loss.backward()
    return loss.detach()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rel_err(got: Tensor, want: Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def main() -> None:
    args = parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    chunk = (
        auto_chunk_tokens(args.vocab, dtype, device=device) if args.chunk_tokens == "auto" else int(args.chunk_tokens)
    )
    inputs = make_inputs(args)
    hidden_TD, weight_VD = inputs[0], inputs[1]

    def naive(h: Tensor, w: Tensor, y: Tensor, n: float) -> Tensor:
        return full_logits_cross_entropy(h, w, y, normaliser=n, ignore_index=IGNORE_INDEX)

    def chunked(h: Tensor, w: Tensor, y: Tensor, n: float) -> Tensor:
        return chunked_cross_entropy(h, w, y, normaliser=n, chunk_tokens=chunk, ignore_index=IGNORE_INDEX)

    sides: dict[str, LossFn] = {"naive": naive, "chunked": chunked}
    peaks: dict[str, int] = {}
    results: dict[str, tuple[Tensor, Tensor, Tensor]] = {}
    for name, fn in sides.items():
        losses: list[Tensor] = []
        peaks[name] = peak_allocated_bytes(lambda fn=fn, out=losses: out.append(step(fn, *inputs)), device)
        assert hidden_TD.grad is not None and weight_VD.grad is not None
        results[name] = (losses[0], hidden_TD.grad, weight_VD.grad)
        print(f"{name}: loss {losses[0].item():.6f}, peak {peaks[name] / 2**20:.0f} MiB", flush=True)
    hidden_TD.grad = weight_VD.grad = None
    loss_abs_diff = float((results["chunked"][0] - results["naive"][0]).abs())
    max_grad_rel_err = max(rel_err(results["chunked"][i], results["naive"][i]) for i in (1, 2))
    del results

    times: dict[str, list[float]] = {name: [] for name in sides}
    for round_index in range(args.rounds):
        order = list(sides) if round_index % 2 == 0 else list(reversed(sides))
        for name in order:
            synchronize(device)
            start = time.perf_counter()
            step(sides[name], *inputs)
            synchronize(device)
            times[name].append(time.perf_counter() - start)
            print(f"round {round_index} {name}: {times[name][-1]:.3f} s", flush=True)
        hidden_TD.grad = weight_VD.grad = None

    median = {name: statistics.median(t) for name, t in times.items()}
    ratios = [chunked / naive for chunked, naive in zip(times["chunked"], times["naive"], strict=True)]
    weight_grad_floor = args.vocab * args.hidden * 4  # the fp32 weight gradient (accumulator) must exist
    figures = {
        "peak_ratio": round(peaks["chunked"] / peaks["naive"], 4),
        "time_ratio": round(median["chunked"] / median["naive"], 4),
        # the spread: each round's own ratio (both sides timed in that round), min and max
        "time_ratio_min_max": [round(min(ratios), 4), round(max(ratios), 4)],
        "max_grad_rel_err": float(f"{max_grad_rel_err:.3g}"),
        "loss_abs_diff": float(f"{loss_abs_diff:.3g}"),
        "peak_naive_bytes": peaks["naive"],
        "peak_chunked_bytes": peaks["chunked"],
        "floor_ratio": round(weight_grad_floor / peaks["naive"], 4),
        "time_naive_s": round(median["naive"], 3),
        "time_chunked_s": round(median["chunked"], 3),
        "chunk_tokens": chunk,
        "tokens": args.tokens,
        "vocab": args.vocab,
        "hidden": args.hidden,
        "dtype": args.dtype,
        "device": args.device,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.machine(),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
