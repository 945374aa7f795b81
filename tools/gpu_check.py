"""Checks that need an NVIDIA GPU, run by tools/gpu_check.sh on a lent GPU machine (never in CI).

Each check compares the GPU path with the CPU fp32 path that the test suite already proves against transformers,
so a wrong kernel shows as a large difference. Ends with one JSON line of the figures.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch


def attention_backends() -> dict[str, Any]:
    """Every CUDA attention backend present, packed bf16 forward+backward vs SDPA per document in fp32."""
    from xtrain.model.attention_backends import (
        CONCRETE_BACKENDS,
        attention_function,
        detect_capabilities,
        sdpa_per_document,
        unavailable_reason,
    )
    from xtrain.model.documents import PackedDocuments

    device = torch.device("cuda")
    caps = detect_capabilities(device, torch.bfloat16)
    lengths = [700, 1, 129, 2048, 300]
    docs = PackedDocuments.from_lengths(lengths, device)
    tokens, heads, kv_heads, head_dim = sum(lengths), 16, 4, 128
    generator = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(tokens, h, head_dim, generator=generator) for h in (heads, kv_heads, kv_heads))
    grad_out = torch.randn(tokens, heads, head_dim, generator=generator)
    scale = head_dim**-0.5

    def run(fn: Any, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        inputs = [t.to(device, dtype).requires_grad_(True) for t in (q, k, v)]
        out = fn(*inputs, docs, scale)
        out.backward(grad_out.to(device, dtype))
        return (out.float(), *(t.grad.float() for t in inputs if t.grad is not None))

    reference = run(sdpa_per_document, torch.float32)
    results: dict[str, Any] = {}
    for name in CONCRETE_BACKENDS:
        reason = unavailable_reason(name, caps)
        if reason is not None:
            results[name] = {"available": False, "reason": reason}
            continue
        got = run(attention_function(name), torch.bfloat16)
        diffs = [float((g - r).abs().max()) for g, r in zip(got, reference, strict=True)]
        results[name] = {"available": True, "max_abs_diff_out_dq_dk_dv": diffs, "ok": max(diffs) < 5e-2}
    return results


def model_on_gpu() -> dict[str, Any]:
    """The debug model in bf16 on the GPU against the same weights in fp32 on the CPU."""
    from xtrain.model.sizes import model_config
    from xtrain.model.transformer import Transformer

    torch.manual_seed(0)
    cpu_model = Transformer(model_config("debug"))
    cpu_model.init_weights()
    gpu_model = Transformer(model_config("debug"))
    gpu_model.load_state_dict(cpu_model.state_dict())
    gpu_model = gpu_model.to("cuda", torch.bfloat16)
    lengths = [300, 17, 450, 257]
    ids = torch.randint(0, cpu_model.config.vocab_size, (1, sum(lengths)))
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    reference = cpu_model(ids, cu_seqlens)
    got = gpu_model(ids.cuda(), cu_seqlens.cuda()).float().cpu()
    rel = float((got - reference).norm() / reference.norm())
    return {"attention_backend": gpu_model.attention_backend, "relative_error_vs_cpu_fp32": rel, "ok": rel < 3e-2}


def moe_block_on_gpu() -> dict[str, Any]:
    """The MoE block's grouped-matmul path on the GPU (bf16) against the CPU fp32 block with the same weights."""
    from xtrain.model.moe import MoEBlock, MoEConfig

    config = MoEConfig(num_experts=64, num_experts_per_tok=8, moe_intermediate_size=256, norm_topk_prob=True)
    torch.manual_seed(0)
    cpu_block = MoEBlock(1024, config)
    cpu_block.init_weights()
    gpu_block = MoEBlock(1024, config)
    gpu_block.load_state_dict(cpu_block.state_dict())
    gpu_block = gpu_block.to("cuda", torch.bfloat16)
    x = torch.randn(4096, 1024)
    reference, _ = cpu_block(x)
    x_gpu = x.to("cuda", torch.bfloat16).requires_grad_(True)
    got, _ = gpu_block(x_gpu)
    got.float().pow(2).mean().backward()
    torch.cuda.synchronize()
    rel = float((got.float().cpu() - reference).norm() / reference.norm())
    impl = gpu_block.experts.impl_for(x_gpu)
    return {"experts_impl": impl, "relative_error_vs_cpu_fp32": rel, "ok": rel < 3e-2 and impl == "grouped_mm"}


def nvml() -> dict[str, Any]:
    from xtop.resources import sample_gpus

    gpus, note = sample_gpus()
    return {"gpus": [g.name for g in gpus], "note": note, "ok": bool(gpus)}


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; this script is for the lent GPU machine (tools/gpu_check.sh)")
        return 2
    figures: dict[str, Any] = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
    for name, check in [
        ("attention", attention_backends),
        ("model", model_on_gpu),
        ("moe_block", moe_block_on_gpu),
        ("nvml", nvml),
    ]:
        started = time.perf_counter()
        try:
            figures[name] = check()
        except Exception as error:  # report every check, even when one breaks
            figures[name] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        figures[name]["seconds"] = round(time.perf_counter() - started, 2)
        print(name, figures[name], flush=True)
    checks = [figures["model"], figures["moe_block"], figures["nvml"]]
    attention = figures["attention"]
    checks += (
        [attention]
        if "error" in attention
        else [r for r in attention.values() if isinstance(r, dict) and r.get("available")]
    )
    figures["all_ok"] = all(c.get("ok") for c in checks)
    print(json.dumps(figures))
    return 0 if figures["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
