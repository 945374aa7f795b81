"""Hugging Face checkpoint layout of ONE layer's MoE block; the only place that knows it.

Layouts (`p` = hf_prefix, e.g. "model.layers.3.mlp."):
- router: `p + "gate.weight"` [E, D]; sigmoid router also `p + "gate.e_score_correction_bias"` [E];
- routed experts, per expert (real Hub checkpoints, and what transformers 5.x `save_pretrained` writes):
  `p + "experts.{e}.gate_proj.weight"` [F, D], `... .up_proj.weight` [F, D], `... .down_proj.weight` [D, F];
- routed experts, fused (transformers 5.x's in-memory layout, which its loader also accepts):
  `p + "experts.gate_up_proj"` [E, 2F, D], `p + "experts.down_proj"` [E, D, F];
- shared experts (DeepSeek-V3): `p + "shared_experts.{gate,up,down}_proj.weight"`;
- GPT-OSS (router `topk_softmax`): `p + "router.weight"` [E, D], `p + "router.bias"` [E], and the experts fused
  only, transposed, with gate and up *interleaved* (columns 0, 2, 4, ... the gate):
  `p + "experts.gate_up_proj"` [E, D, 2F], `..._bias` [E, 2F], `p + "experts.down_proj"` [E, F, D], `..._bias`
  [E, D]. xtrain keeps its own [E, 2F, D] gate-first layout and converts with copies (bit exact both ways).

Reading accepts both expert layouts; writing produces the per-expert one. Tensors are copied, never converted,
so a read after a write gives back the same bits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from xtrain.model.moe.config import MoEConfig

_SHARED = ("gate_proj", "up_proj", "down_proj")


def moe_hf_keys(hf_prefix: str, config: MoEConfig) -> list[str]:
    """The checkpoint keys `moe_state_to_hf` writes for one layer (per-expert layout)."""
    if config.router == "topk_softmax":
        return [f"{hf_prefix}{name}" for name in _GPT_OSS_KEYS]
    keys = [f"{hf_prefix}gate.weight"]
    if config.router == "sigmoid_group_limited":
        keys.append(f"{hf_prefix}gate.e_score_correction_bias")
    for e in range(config.num_experts):
        keys += [f"{hf_prefix}experts.{e}.{name}.weight" for name in ("gate_proj", "up_proj", "down_proj")]
    if config.num_shared_experts > 0:
        keys += [f"{hf_prefix}shared_experts.{name}.weight" for name in _SHARED]
    return keys


def moe_state_from_hf(get: Callable[[str], torch.Tensor], hf_prefix: str, config: MoEConfig) -> dict[str, torch.Tensor]:
    """MoEBlock state dict (keys relative to the block) from one layer's checkpoint tensors.

    `get(key)` returns a checkpoint tensor and raises KeyError for an absent key; the error of the first key
    of the per-expert layout propagates when neither expert layout is present.
    """
    return dict(iter_moe_state_from_hf(get, hf_prefix, config))


def iter_moe_state_from_hf(
    get: Callable[[str], torch.Tensor], hf_prefix: str, config: MoEConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of :func:`moe_state_from_hf`, one (name, tensor) at a time.

    Each fused expert tensor is allocated once and filled expert by expert as the checkpoint tensors are read,
    and the generator drops its reference before building the next: a caller that also drops each tensor before
    asking for the next holds at most one block tensor and one expert's slice at a time (what lets a sharded
    load stay within one rank's share plus one tensor).
    """
    if config.router == "topk_softmax":
        yield from _gpt_oss_from_hf(get, hf_prefix)
        return
    yield "router.weight", get(f"{hf_prefix}gate.weight")
    if config.router == "sigmoid_group_limited":
        yield "router.e_score_correction_bias", get(f"{hf_prefix}gate.e_score_correction_bias")
    try:
        first_gate = get(f"{hf_prefix}experts.0.gate_proj.weight")
    except KeyError as per_expert_missing:
        try:
            gate_up = get(f"{hf_prefix}experts.gate_up_proj")
        except KeyError:
            raise per_expert_missing from None
        yield "experts.gate_up_proj", gate_up
        del gate_up
        yield "experts.down_proj", get(f"{hf_prefix}experts.down_proj")
    else:
        f, d = first_gate.shape
        gate_up = first_gate.new_empty((config.num_experts, 2 * f, d))
        _place(gate_up[0, :f], first_gate, f"{hf_prefix}experts.0.gate_proj.weight")
        del first_gate
        for e in range(config.num_experts):
            if e:
                _place(gate_up[e, :f], get(key := f"{hf_prefix}experts.{e}.gate_proj.weight"), key)
            _place(gate_up[e, f:], get(key := f"{hf_prefix}experts.{e}.up_proj.weight"), key)
        yield "experts.gate_up_proj", gate_up
        del gate_up
        first_down = get(f"{hf_prefix}experts.0.down_proj.weight")
        down = first_down.new_empty((config.num_experts, *first_down.shape))
        _place(down[0], first_down, f"{hf_prefix}experts.0.down_proj.weight")
        del first_down
        for e in range(1, config.num_experts):
            _place(down[e], get(key := f"{hf_prefix}experts.{e}.down_proj.weight"), key)
        yield "experts.down_proj", down
        del down
    if config.num_shared_experts > 0:
        for name in _SHARED:
            yield f"shared_experts.{name}.weight", get(f"{hf_prefix}shared_experts.{name}.weight")


def _place(slot: torch.Tensor, tensor: torch.Tensor, key: str) -> None:
    # copy_ would broadcast a tensor of the wrong shape silently; the experts of a layer must all agree.
    if slot.shape != tensor.shape:
        raise ValueError(f"{key} has shape {list(tensor.shape)}, but expert 0 implies {list(slot.shape)}")
    slot.copy_(tensor)


def moe_state_to_hf(state: dict[str, torch.Tensor], hf_prefix: str, config: MoEConfig) -> dict[str, torch.Tensor]:
    """One layer's checkpoint tensors (per-expert layout, contiguous, unshared storage) from a MoEBlock state."""
    if config.router == "topk_softmax":
        return _gpt_oss_to_hf(state, hf_prefix)
    f = config.moe_intermediate_size
    out = {f"{hf_prefix}gate.weight": state["router.weight"].contiguous()}
    # A state of gradients has no entry for the correction bias (a buffer): it is skipped there.
    if config.router == "sigmoid_group_limited" and "router.e_score_correction_bias" in state:
        out[f"{hf_prefix}gate.e_score_correction_bias"] = state["router.e_score_correction_bias"].contiguous()
    gate_up = state["experts.gate_up_proj"]
    down = state["experts.down_proj"]
    for e in range(config.num_experts):
        # clone: safetensors refuses tensors that share storage with another saved tensor.
        out[f"{hf_prefix}experts.{e}.gate_proj.weight"] = gate_up[e, :f].clone()
        out[f"{hf_prefix}experts.{e}.up_proj.weight"] = gate_up[e, f:].clone()
        out[f"{hf_prefix}experts.{e}.down_proj.weight"] = down[e].clone()
    if config.num_shared_experts > 0:
        for name in _SHARED:
            out[f"{hf_prefix}shared_experts.{name}.weight"] = state[f"shared_experts.{name}.weight"].contiguous()
    return out


_GPT_OSS_KEYS = (
    "router.weight",
    "router.bias",
    "experts.gate_up_proj",
    "experts.gate_up_proj_bias",
    "experts.down_proj",
    "experts.down_proj_bias",
)


def _gpt_oss_from_hf(get: Callable[[str], torch.Tensor], p: str) -> Iterator[tuple[str, torch.Tensor]]:
    yield "router.weight", get(f"{p}router.weight")
    yield "router.bias", get(f"{p}router.bias")
    gate_up_ED2F = get(f"{p}experts.gate_up_proj")
    # [E, D, 2F] interleaved -> [E, 2F, D] gate rows first.
    yield "experts.gate_up_proj", _deinterleave(gate_up_ED2F.transpose(1, 2), dim=1)
    del gate_up_ED2F
    yield "experts.gate_up_proj_bias", _deinterleave(get(f"{p}experts.gate_up_proj_bias"), dim=1)
    yield "experts.down_proj", get(f"{p}experts.down_proj").transpose(1, 2).contiguous()
    yield "experts.down_proj_bias", get(f"{p}experts.down_proj_bias")


def _gpt_oss_to_hf(state: dict[str, torch.Tensor], p: str) -> dict[str, torch.Tensor]:
    gate_up_E2FD = state["experts.gate_up_proj"]
    return {
        f"{p}router.weight": state["router.weight"].contiguous(),
        f"{p}router.bias": state["router.bias"].contiguous(),
        f"{p}experts.gate_up_proj": _interleave(gate_up_E2FD, dim=1).transpose(1, 2).contiguous(),
        f"{p}experts.gate_up_proj_bias": _interleave(state["experts.gate_up_proj_bias"], dim=1),
        f"{p}experts.down_proj": state["experts.down_proj"].transpose(1, 2).contiguous(),
        f"{p}experts.down_proj_bias": state["experts.down_proj_bias"].contiguous(),
    }


def _deinterleave(x: torch.Tensor, dim: int) -> torch.Tensor:
    """(g0, u0, g1, u1, ...) -> (g0, g1, ..., u0, u1, ...) along ``dim`` (a copy)."""
    even = torch.arange(0, x.shape[dim], 2, device=x.device)
    return torch.cat((x.index_select(dim, even), x.index_select(dim, even + 1)), dim=dim)


def _interleave(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The inverse of :func:`_deinterleave` (a copy)."""
    half = x.shape[dim] // 2
    return torch.stack((x.narrow(dim, 0, half), x.narrow(dim, half, half)), dim=dim + 1).flatten(dim, dim + 1)
