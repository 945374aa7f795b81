#!/usr/bin/env bash
# Every check that needs an NVIDIA GPU, as ONE script for a lent single-GPU machine (H200 here), in under 9.5 minutes
# on one GPU: each step has its own limit (565 s together without step 5, which needs several GPUs), so the whole
# fits one device command (10 minutes at most) and leaves time of the session's 15 for a rerun.
#
# That machine has no network and its own python3 (3.12) with a CUDA torch 2.11, transformers, pytest,
# pytest-xdist, hypothesis, safetensors, tokenizers, jinja2, click, rich, numpy and matplotlib
# (/work/.library/device/KINDS.md). What it lacks travels as wheels in .whl/ (ignored by git), prepared HERE first:
#
#     bash tools/gpu_check.sh --prepare-wheels     # pip download of the wheels below, for CPython 3.12 x86-64
#
# then, through the device tool, with carry [".whl"]:   bash tools/gpu_check.sh
# On this CPU machine:   bash tools/gpu_check.sh --dry-run   runs the same steps small, on the CPU, with .venv's
# python and no time limits (minutes on a loaded 2-core machine): it checks the script, not the GPU.
#
# Steps, each under its own time limit (the whole within 9.5 minutes: the device tool's limit is 10 per command):
#  1. install (75 s): the wheels, then the workspace packages the checks import (deeptrace, xtrain) with
#     `pip install --no-deps --no-index --no-build-isolation -e` (hatchling, their build backend, is one of the
#     wheels); if the interpreter's environment is not writable, the wheels go to /tmp/site and the packages'
#     src/ folders on PYTHONPATH instead (said in the output).
#  2. CUDA tests (110 s): the project has no `cuda` pytest marker (pyproject.toml declares slow, slurm, postgres,
#     multiprocess): its CUDA-only tests sit behind torch.cuda.is_available() (the flash_attn and torch_varlen
#     attention backends in tests/engine/test_attention.py), so the whole of tests/engine runs with the GPU
#     visible; every CUDA test then runs, and the rest proves the same code on that machine's torch.
#  3. GPU against CPU (with step 4, 150 s): the `debug` model in bf16 on the GPU against the same weights in fp32
#     on the CPU, the MoE block's grouped-matmul path likewise (relative error < 3e-2), and xtop's NVML sampling.
#  4. training: a Qwen3-30B-A3B-shaped model cut to GPU_CHECK_LAYERS decoder layers (default 6: 4.4 B
#     parameters, ~70 GB of fp32 weights, gradients and AdamW state), trained by xtrain on one GPU (FSDP2 over a
#     one-rank mesh, bf16 compute, chunked loss, fused AdamW) on packs of 8,192 and 32,768 tokens (documents of
#     mean length 2,048); per pack size: tokens/s (median of the timed steps), MFU, peak allocated memory, the
#     attention backend and the grouped-matmul implementation used.
#  5. expert parallelism (240 s, only with more than one GPU): tools/bench/ep_overlap.py.
#  6. long packs (110 s): the step-4 model with memory.checkpointing none / full / full + offload, packs doubling
#     from 16k tokens: the longest that trains per mode, and the step time of offload against full.
#  7. the chunked loss (45 s): tools/bench/chunk_loss.py on CUDA (16k tokens, vocabulary 151,936, bf16): peak memory
#     and time against the full-logits cross-entropy.
#  8. the MoE block (75 s): the blocks of tools/bench/moe_block.py on the GPU in bf16, xtrain against
#     transformers' eager and grouped_mm experts: best step time, peak memory, largest output difference.
# Step 3 also compares the flash-attn (when installed) and torch varlen attention kernels with per-document SDPA.
# Ends with one JSON line of everything; exits non-zero when a test or check failed.
set -uo pipefail
cd "$(dirname "$0")/.."

WHEEL_DIR=.whl
# The versions of uv.lock for what the workspace imports (pydantic and its compiled core must match), and the
# build backend for the editable installs (hatchling; tomlkit, trove-classifiers and editables are its needs that
# the image lacks; packaging, pathspec and pluggy are there).
LOCKED_WHEELS=(pydantic pydantic-core annotated-types typing-inspection orjson)
BUILD_WHEELS=(hatchling==1.33.0 tomlkit==0.14.0 trove-classifiers==2026.9.21.13 editables==0.6)

prepare_wheels() {
    grep -qx "/.whl/" .gitignore .git/info/exclude 2>/dev/null || echo "/.whl/" >>.git/info/exclude
    local specs=("${BUILD_WHEELS[@]}") name version
    for name in "${LOCKED_WHEELS[@]}"; do
        version=$(grep -A1 "^name = \"$name\"$" uv.lock | sed -n 's/version = "\(.*\)"/\1/p')
        specs+=("$name==$version")
    done
    rm -rf "$WHEEL_DIR"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$WHEEL_DIR" "${specs[@]}"
    ls "$WHEEL_DIR"
}

case "${1:-}" in
    --prepare-wheels) prepare_wheels; exit ;;
    --dry-run) DRY_RUN=1 ;;
    "") DRY_RUN=0 ;;
    *) echo "usage: bash tools/gpu_check.sh [--prepare-wheels | --dry-run]" >&2; exit 2 ;;
esac

export PYTHONUNBUFFERED=1
WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)
status=0
if ((DRY_RUN)); then
    PY=.venv/bin/python
    TEST_ARGS=(tests/engine/test_attention.py)
else
    PY=python3
    TEST_ARGS=(-n 8 tests/engine)
    echo "== 1. install"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || status=1
    compgen -G "$WHEEL_DIR/*.whl" >/dev/null || echo "no wheels in $WHEEL_DIR/: run --prepare-wheels here first"
    if timeout 30 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$WHEEL_DIR"/*.whl &&
        timeout 45 $PY -m pip install -q --no-index --no-deps --no-build-isolation \
            -e packages/deeptrace -e packages/engine; then
        echo "installed: wheels and editable deeptrace, xtrain into $($PY -c 'import sys; print(sys.prefix)')"
    else
        echo "editable install failed: wheels into /tmp/site, packages from their src/ folders on PYTHONPATH"
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            "$WHEEL_DIR"/*.whl || status=1
        export PYTHONPATH="packages/engine/src:packages/deeptrace/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    fi
fi
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'device',
torch.cuda.get_device_name() if torch.cuda.is_available() else None)"

echo "== 2. tests (${TEST_ARGS[*]}) with CUDA visible"
timeout $((DRY_RUN ? 900 : 110)) $PY -m pytest -q -p no:cacheprovider -rs --junitxml "$WORK/tests.xml" "${TEST_ARGS[@]}" 2>&1 |
    tail -n 40 || status=1

echo "== 3-4. GPU against CPU, then training throughput"
timeout $((DRY_RUN ? 900 : 150)) $PY - "$WORK" "$DRY_RUN" <<'PY' || status=1
"""Steps 3 and 4 of tools/gpu_check.sh; writes WORK/figures.json."""

import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

work, dry_run = Path(sys.argv[1]), sys.argv[2] == "1"
device = torch.device("cpu" if dry_run else "cuda")
dtype = torch.float32 if dry_run else torch.bfloat16


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float().cpu() - want).norm() / want.norm())


def model_against_cpu() -> dict[str, Any]:
    """The debug model on the device against the same weights in fp32 on the CPU (the parity-tested path)."""
    from xtrain.model.sizes import model_config
    from xtrain.model.transformer import Transformer

    torch.manual_seed(0)
    reference_model = Transformer(model_config("debug"))
    reference_model.init_weights()
    model = Transformer(model_config("debug"))
    model.load_state_dict(reference_model.state_dict())
    model = model.to(device, dtype)
    lengths = [300, 17, 450, 257]
    ids = torch.randint(0, model.config.vocab_size, (1, sum(lengths)))
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    with torch.no_grad():
        reference = reference_model(ids, cu_seqlens)
        got = model(ids.to(device), cu_seqlens.to(device))
    error = relative_error(got, reference)
    return {"attention_backend": model.attention_backend, "relative_error": error, "ok": error < 3e-2}


def moe_block_against_cpu() -> dict[str, Any]:
    """The MoE block (grouped matmul on the device) against the same weights in fp32 on the CPU."""
    from xtrain.model.moe import MoEBlock, MoEConfig

    config = MoEConfig(num_experts=64, num_experts_per_tok=8, moe_intermediate_size=256, norm_topk_prob=True)
    torch.manual_seed(0)
    reference_block = MoEBlock(1024, config)
    reference_block.init_weights()
    block = MoEBlock(1024, config)
    block.load_state_dict(reference_block.state_dict())
    block = block.to(device, dtype)
    x = torch.randn(4096, 1024)
    with torch.no_grad():
        reference, _ = reference_block(x)
        got, _ = block(x.to(device, dtype))
    error = relative_error(got, reference)
    impl = block.experts.impl_for(x.to(device, dtype))
    return {"experts_impl": impl, "relative_error": error, "ok": error < 3e-2 and impl == "grouped_mm"}


def document_lengths(pack_tokens: int, mean: int, generator: torch.Generator) -> list[int]:
    lengths: list[int] = []
    while sum(lengths) < pack_tokens:
        lengths.append(max(16, int(-mean * math.log(1.0 - float(torch.rand((), generator=generator))))))
    lengths[-1] -= sum(lengths) - pack_tokens
    return [n for n in lengths if n > 0]


def train_throughput() -> dict[str, Any]:
    """xtrain's training step on one device at two pack sizes: tokens/s, MFU, peak memory, backends."""
    from xtrain.config import OptimSection
    from xtrain.loss import auto_chunk_tokens
    from xtrain.model.documents import PackedDocuments
    from xtrain.model.flops import training_flops_per_token
    from xtrain.model.sizes import model_config
    from xtrain.model.transformer import Transformer
    from xtrain.parallel.distributed import close_distributed, init_distributed
    from xtrain.parallel.fsdp import apply_fsdp
    from xtrain.parallel.materialize import materialize
    from xtrain.parallel.mesh import data_parallel_mesh
    from xtrain.train.metrics import device_peak_flops, mfu
    from xtrain.train.optimizer import build_optimizer
    from xtrain.train.step import GlobalBatch, LossSettings, MicroBatch, train_step

    if dry_run:  # the plumbing only: the debug model, small packs
        config, packs, steps = model_config("debug"), [512, 1024], (1, 2)
    else:
        layers = int(os.environ.get("GPU_CHECK_LAYERS", "6"))
        config = model_config("qwen3-30b-a3b").model_copy(update={"num_layers": layers})
        packs, steps = [8192, 32768], (2, 4)
    init_distributed(device.type)  # a one-rank process group: FSDP2 needs a mesh
    with torch.device("meta"):
        model = Transformer(config)
    apply_fsdp(model, data_parallel_mesh(device.type, 1, 1), param_dtype=dtype)
    materialize(model, device, seed=0)
    optimizer = build_optimizer(model, OptimSection(lr=1e-4), device)
    settings = LossSettings(
        chunk_tokens=auto_chunk_tokens(config.vocab_size, dtype, device=device),
        aux_loss_coef=0.001,
        z_loss_coef=0.0,
        max_grad_norm=1.0,
    )
    moe_layer = next(layer.moe for layer in model.layers if getattr(layer, "moe", None) is not None)
    probe = torch.zeros(8, config.hidden_size, device=device, dtype=dtype)
    figures: dict[str, Any] = {
        "model": f"qwen3-30b-a3b shape, {config.num_layers} layers" if not dry_run else "debug",
        "parameters": sum(p.numel() for p in model.parameters()),
        "attention_backend": model.attention_backend,
        "grouped_mm_backend": moe_layer.experts.impl_for(probe),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
    }
    peak = device_peak_flops(device, dtype)
    generator = torch.Generator().manual_seed(0)
    for pack_tokens in packs:
        lengths = document_lengths(pack_tokens, 2048, generator)
        batch = MicroBatch(
            input_ids=torch.randint(0, config.vocab_size, (1, pack_tokens), generator=generator).to(device),
            labels=torch.randint(0, config.vocab_size, (pack_tokens,), generator=generator).to(device),
            documents=PackedDocuments.from_lengths(lengths, device),
        )
        global_batch = GlobalBatch(target_tokens=pack_tokens, routed_tokens=pack_tokens)
        warmup, timed = steps
        try:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            times = []
            for index in range(warmup + timed):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                started = time.perf_counter()
                train_step(model, optimizer, [batch], global_batch, settings, dp_size=1)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if index >= warmup:
                    times.append(time.perf_counter() - started)
        except torch.OutOfMemoryError as error:
            figures[str(pack_tokens)] = {"error": f"out of memory: {str(error)[:200]}"}
            torch.cuda.empty_cache()
            continue
        step_s = statistics.median(times)
        tokens_per_s = pack_tokens / step_s
        utilisation = mfu(training_flops_per_token(config, lengths), tokens_per_s, peak)
        figures[str(pack_tokens)] = {
            "tokens_per_s": round(tokens_per_s, 1),
            "step_s": round(step_s, 4),
            "step_s_min_max": [round(min(times), 4), round(max(times), 4)],
            "mfu": None if utilisation is None else round(utilisation, 4),
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
            if device.type == "cuda"
            else None,
            "documents": len(lengths),
        }
        print(pack_tokens, figures[str(pack_tokens)], flush=True)
    close_distributed()
    return figures


def nvml() -> dict[str, Any]:
    """xtop's GPU sampling through NVML sees the GPU (none is expected in the dry run)."""
    sys.path.append("apps/tui/src")  # xtop is not installed here: its resources module needs only psutil, pynvml
    from xtop.resources import sample_gpus

    gpus, note = sample_gpus()
    return {"gpus": [gpu.name for gpu in gpus], "note": note, "ok": bool(gpus) or dry_run}


def attention_parity() -> dict[str, Any]:
    """flash-attn's and torch's varlen kernels against per-document SDPA on the same packed row (GQA, documents of
    mixed lengths, and an MLA-like case whose values are narrower than queries and keys); a kernel that cannot run
    here (flash-attn not installed) is named with why."""
    from xtrain.model.attention_backends import attention_function
    from xtrain.model.documents import PackedDocuments

    torch.manual_seed(0)
    lengths = [1024, 17, 3000, 257, 8]
    docs = PackedDocuments.from_lengths(lengths, device)
    tokens = sum(lengths)
    cases = {"gqa_128": (32, 4, 128, 128), "mla_192_128": (16, 16, 192, 128)}
    figures: dict[str, Any] = {"ok": True}
    for name, (heads, kv_heads, d_qk, d_v) in cases.items():
        q = torch.randn(tokens, heads, d_qk, device=device, dtype=dtype)
        k = torch.randn(tokens, kv_heads, d_qk, device=device, dtype=dtype)
        v = torch.randn(tokens, kv_heads, d_v, device=device, dtype=dtype)
        reference = attention_function("sdpa")(q, k, v, docs, d_qk**-0.5).float()
        for backend in ("torch_varlen", "flash_attn"):
            try:
                got = attention_function(backend)(q, k, v, docs, d_qk**-0.5).float()
            except Exception as error:  # a kernel missing on this machine is a finding, not a crash
                figures[f"{backend}_{name}"] = {"skipped": f"{type(error).__name__}: {error}"[:200]}
                # torch's varlen kernel ships with every CUDA torch: missing there is a failure, not a skip.
                figures["ok"] = figures["ok"] and not (backend == "torch_varlen" and device.type == "cuda")
                continue
            error_rel = float((got - reference).norm() / reference.norm())
            figures[f"{backend}_{name}"] = {"relative_error": error_rel, "ok": error_rel < 2e-2}
            figures["ok"] = figures["ok"] and error_rel < 2e-2
    return figures


parts = [
    ("gpu_vs_cpu_model", model_against_cpu),
    ("attention_parity", attention_parity),
    ("gpu_vs_cpu_moe_block", moe_block_against_cpu),
    ("nvml", nvml),
    ("train", train_throughput),
]
results: dict[str, Any] = {}
for name, part in parts:
    started = time.perf_counter()
    try:
        results[name] = part()
    except Exception as error:  # report every part, even when one breaks
        traceback.print_exc()
        results[name] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
    results[name]["seconds"] = round(time.perf_counter() - started, 1)
    print(name, results[name], flush=True)
    (work / "figures.json").write_text(json.dumps(results))  # after each part: a timeout keeps what was done
PY

echo "== 5. expert parallelism: exposed all-to-all, plain EP against Domino-EP (tools/bench/ep_overlap.py)"
GPUS=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "${GPUS:-0}" -gt 1 ]; then
    # One process per GPU, NCCL; the JSON line goes into the summary as ep_overlap.
    timeout $((DRY_RUN ? 900 : 240)) $PY tools/bench/ep_overlap.py --procs "$GPUS" --steps 4 2>&1 | tail -n 1 |
        tee "$WORK/ep_overlap.json" || status=1
else
    echo "ep_overlap: skipped, it needs more than one GPU and this machine has ${GPUS:-0}"
    echo '{"skipped": "needs more than one GPU", "gpus": '"${GPUS:-0}"'}' >"$WORK/ep_overlap.json"
fi

echo "== 6. long packs: the longest pack that trains per memory mode, and offload's step-time cost"
# The step-4 model (Qwen3-30B-A3B-shaped, GPU_CHECK_LAYERS layers) with memory.checkpointing none / full /
# full + offload; pack lengths doubling from 16k until one runs out of memory (or a step takes > 30 s).
timeout $((DRY_RUN ? 900 : 110)) $PY - "$WORK" "$DRY_RUN" <<'PY' || status=1
"""Step 6 of tools/gpu_check.sh; writes WORK/long_packs.json."""

import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

work, dry_run = Path(sys.argv[1]), sys.argv[2] == "1"
device = torch.device("cpu" if dry_run else "cuda")
dtype = torch.float32 if dry_run else torch.bfloat16

from xtrain.config import OptimSection
from xtrain.loss import auto_chunk_tokens
from xtrain.model.documents import PackedDocuments
from xtrain.model.sizes import model_config
from xtrain.model.transformer import Transformer
from xtrain.parallel.checkpointing import apply_activation_checkpointing
from xtrain.parallel.distributed import close_distributed, init_distributed
from xtrain.parallel.fsdp import apply_fsdp
from xtrain.parallel.materialize import materialize
from xtrain.parallel.mesh import data_parallel_mesh
from xtrain.parallel.offload import apply_activation_offload
from xtrain.train.optimizer import build_optimizer
from xtrain.train.step import GlobalBatch, LossSettings, MicroBatch, train_step

if dry_run:
    config, lengths_to_try, limit_s = model_config("debug"), [256, 512], 600.0
else:
    layers = int(os.environ.get("GPU_CHECK_LAYERS", "6"))
    config = model_config("qwen3-30b-a3b").model_copy(update={"num_layers": layers})
    lengths_to_try, limit_s = [16384 * 2**k for k in range(6)], 30.0
init_distributed(device.type)
results: dict[str, Any] = {"model": "debug" if dry_run else f"qwen3-30b-a3b shape, {config.num_layers} layers"}
for mode in ("none", "full", "full+offload"):
    with torch.device("meta"):
        model = Transformer(config)
    if mode != "none":
        apply_activation_checkpointing(model, "full")
    if mode == "full+offload":
        apply_activation_offload(model, device)
    apply_fsdp(model, data_parallel_mesh(device.type, 1, 1), param_dtype=dtype)
    materialize(model, device, seed=0)
    optimizer = build_optimizer(model, OptimSection(lr=1e-4), device)
    settings = LossSettings(auto_chunk_tokens(config.vocab_size, dtype, device=device), 0.001, 0.0, 1.0)
    trained: dict[str, float] = {}
    for tokens in lengths_to_try:
        documents = PackedDocuments.from_lengths([2048] * (tokens // 2048) or [tokens], device)
        batch = MicroBatch(
            input_ids=torch.randint(0, config.vocab_size, (1, tokens), device=device),
            labels=torch.randint(0, config.vocab_size, (tokens,), device=device),
            documents=documents,
        )
        try:
            started = time.perf_counter()
            train_step(model, optimizer, [batch], GlobalBatch(tokens, tokens), settings, dp_size=1)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            trained[str(tokens)] = round(time.perf_counter() - started, 3)
        except torch.OutOfMemoryError:
            break
        finally:
            del batch
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if trained[str(tokens)] > limit_s:
            break
    longest = max((int(t) for t in trained), default=0)
    results[mode] = {"longest_pack_tokens": longest, "step_s": trained}
    print(mode, results[mode], flush=True)
    del model, optimizer
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    (work / "long_packs.json").write_text(json.dumps(results))
common = [t for t in results["full"]["step_s"] if t in results["full+offload"]["step_s"]]
if common:
    largest = max(common, key=int)
    results["offload_time_ratio"] = round(results["full+offload"]["step_s"][largest] / results["full"]["step_s"][largest], 3)
    results["offload_time_ratio_at_tokens"] = int(largest)
(work / "long_packs.json").write_text(json.dumps(results))
close_distributed()
PY

echo "== 7. the chunked loss's peak memory and time against full logits (tools/bench/chunk_loss.py)"
timeout $((DRY_RUN ? 900 : 45)) $PY tools/bench/chunk_loss.py --rounds 2 $( ((DRY_RUN)) && echo --tokens 512 --vocab 8192) 2>&1 |
    tail -n 1 | tee "$WORK/chunk_loss.json" || status=1

echo "== 8. the MoE block against transformers' on the device (the blocks of tools/bench/moe_block.py)"
timeout $((DRY_RUN ? 900 : 75)) $PY - "$WORK" "$DRY_RUN" <<'PY' || status=1
"""Step 8: xtrain's MoE block against transformers' Qwen3-MoE block (eager and grouped_mm experts), same weights
and gradients, forward+backward on the device in bf16 (fp32 in the dry run): best of 5 timed steps each, peak
memory above the start, and the largest output difference from transformers' eager block."""

import importlib.util
import json
import sys
import time
from pathlib import Path

import torch

work, dry_run = Path(sys.argv[1]), sys.argv[2] == "1"
spec = importlib.util.spec_from_file_location("moe_block", "tools/bench/moe_block.py")
assert spec is not None and spec.loader is not None
bench = importlib.util.module_from_spec(spec)
sys.modules["moe_block"] = bench  # its dataclasses look their module up
spec.loader.exec_module(bench)
device = "cpu" if dry_run else "cuda"
dtype = torch.float32 if dry_run else torch.bfloat16
shape = bench.Shape(tokens=256, hidden=128, experts=8, top_k=2, inter=64) if dry_run else bench.Shape(4096, 1024, 64, 8, 256)
results: dict[str, object] = {"device": device, "dtype": str(dtype).removeprefix("torch."), "tokens": shape.tokens}
outputs = {}
for impl in ("hf_eager", "hf_grouped_mm", "xtrain"):
    try:
        block = bench.build(impl, shape, dtype, device)
        x, grad_y = bench.inputs(shape, dtype, device)
        step = bench.make_step(impl, block, x, grad_y)
        step()
        bench.sync(device)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        start_bytes = torch.cuda.memory_allocated() if device == "cuda" else 0
        times = []
        for _ in range(5):
            started = time.perf_counter()
            y, _grad = step()
            bench.sync(device)
            times.append(time.perf_counter() - started)
        outputs[impl] = y.float().cpu()
        peak = torch.cuda.max_memory_allocated() - start_bytes if device == "cuda" else None
        results[impl] = {"best_s": min(times), "worst_s": max(times), "peak_bytes": peak}
        del block, step
    except Exception as error:  # one implementation failing is a finding: the others still run
        results[impl] = {"error": f"{type(error).__name__}: {error}"[:300]}
timed = {impl: r["best_s"] for impl, r in results.items() if isinstance(r, dict) and "best_s" in r}
hf = [timed[impl] for impl in ("hf_eager", "hf_grouped_mm") if impl in timed]
if "xtrain" in timed and hf:
    results["speedup_vs_hf_best"] = round(min(hf) / timed["xtrain"], 3)
if "xtrain" in outputs and "hf_eager" in outputs:
    results["max_abs_diff"] = float((outputs["xtrain"] - outputs["hf_eager"]).abs().max())
(work / "moe_block.json").write_text(json.dumps(results))
print(json.dumps(results))
PY

echo "== summary"
$PY - "$WORK" "$status" "$SECONDS" <<'PY'
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

work, status, seconds = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
summary = {}
try:
    suite = ET.parse(work / "tests.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    summary["tests"] = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
except (OSError, ET.ParseError, IndexError) as error:
    summary["tests"] = {"error": f"no test report: {error}"}
figures_path = work / "figures.json"
figures = json.loads(figures_path.read_text()) if figures_path.exists() else {}
summary.update(figures)
try:
    summary["ep_overlap"] = json.loads((work / "ep_overlap.json").read_text())
except (OSError, ValueError) as error:
    summary["ep_overlap"] = {"error": f"no ep_overlap figures: {error}"}
for name in ("long_packs", "chunk_loss", "moe_block"):
    try:
        summary[name] = json.loads((work / f"{name}.json").read_text())
    except (OSError, ValueError) as error:
        summary[name] = {"error": f"no {name} figures: {error}"}
if "train" not in figures:
    summary["error"] = "steps 3-4 did not finish (time limit or crash): see the output above"
tests_ok = summary["tests"].get("failures") == 0 and summary["tests"].get("errors") == 0
checks = ("gpu_vs_cpu_model", "attention_parity", "gpu_vs_cpu_moe_block", "nvml")
checks_ok = all(figures.get(k, {}).get("ok") for k in checks)
train_ok = "error" not in figures.get("train", {"error": "missing"})
summary["all_ok"] = status == 0 and tests_ok and checks_ok and train_ok
summary["elapsed_s"] = seconds
print(json.dumps(summary))
sys.exit(0 if summary["all_ok"] else 1)
PY
