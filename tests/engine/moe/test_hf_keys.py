"""One layer's MoE block in Hugging Face checkpoints: the Hub layout, transformers' own, bit-exact round trips."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from xtrain.model.moe import MoEBlock, MoEConfig
from xtrain.model.moe.hf_keys import moe_hf_keys, moe_state_from_hf, moe_state_to_hf


def _tiny_qwen3_moe(path: Path, experts: int = 4) -> tuple[object, dict[str, torch.Tensor]]:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        moe_intermediate_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        num_experts=experts,
        num_experts_per_tok=2,
        norm_topk_prob=True,
    )
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg)
    model.save_pretrained(path)
    return model, load_file(path / "model.safetensors")


def test_reads_what_transformers_writes_and_round_trips_bit_exactly(tmp_path: Path) -> None:
    model, saved = _tiny_qwen3_moe(tmp_path)
    hf_block = model.model.layers[1].mlp  # type: ignore[attr-defined]
    # transformers 5.x save_pretrained writes the per-expert layout of Hub checkpoints.
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in saved
    assert saved["model.layers.1.mlp.experts.3.gate_proj.weight"].shape == (8, 16)
    assert "model.layers.1.mlp.experts.gate_up_proj" not in saved

    cfg = MoEConfig.from_hf_config(model.config.to_dict())  # type: ignore[attr-defined]
    prefix = "model.layers.1.mlp."
    state = moe_state_from_hf(saved.__getitem__, prefix, cfg)
    assert torch.equal(state["experts.gate_up_proj"], hf_block.experts.gate_up_proj.detach())
    assert torch.equal(state["experts.down_proj"], hf_block.experts.down_proj.detach())
    block = MoEBlock(16, cfg)
    block.load_state_dict(state)

    written = moe_state_to_hf(block.state_dict(), prefix, cfg)
    assert sorted(written) == sorted(moe_hf_keys(prefix, cfg))
    assert sorted(written) == sorted(k for k in saved if k.startswith(prefix))
    for key, tensor in written.items():
        assert tensor.dtype == saved[key].dtype and torch.equal(tensor, saved[key]), key
    save_file(written, str(tmp_path / "layer.safetensors"))  # contiguous, unshared: safetensors accepts it


def test_transformers_loads_what_xtrain_writes(tmp_path: Path) -> None:
    from transformers import Qwen3MoeForCausalLM

    model, saved = _tiny_qwen3_moe(tmp_path / "orig")
    cfg = MoEConfig.from_hf_config(model.config.to_dict())  # type: ignore[attr-defined]
    rewritten = dict(saved)
    for layer in range(2):
        prefix = f"model.layers.{layer}.mlp."
        state = moe_state_from_hf(saved.__getitem__, prefix, cfg)
        block = MoEBlock(16, cfg)
        block.init_weights(torch.Generator().manual_seed(layer + 1))  # new weights, to see them arrive
        for k in list(rewritten):
            if k.startswith(prefix):
                del rewritten[k]
        rewritten |= moe_state_to_hf(block.state_dict(), prefix, cfg)
        assert not torch.equal(block.state_dict()["experts.down_proj"], state["experts.down_proj"])
        (tmp_path / "new").mkdir(exist_ok=True)
        expected = block.state_dict()
        if layer == 1:
            save_file(rewritten, str(tmp_path / "new" / "model.safetensors"), metadata={"format": "pt"})
            (tmp_path / "new" / "config.json").write_text((tmp_path / "orig" / "config.json").read_text())
            loaded, info = Qwen3MoeForCausalLM.from_pretrained(tmp_path / "new", output_loading_info=True)
            assert not info["missing_keys"] and not info["unexpected_keys"]
            mlp = loaded.model.layers[1].mlp
            assert torch.equal(mlp.experts.gate_up_proj.detach(), expected["experts.gate_up_proj"])
            assert torch.equal(mlp.experts.down_proj.detach(), expected["experts.down_proj"])
            assert torch.equal(mlp.gate.weight.detach(), expected["router.weight"])


def test_reads_the_fused_layout_too() -> None:
    cfg = MoEConfig(num_experts=3, num_experts_per_tok=1, moe_intermediate_size=4)
    fused = {
        "p.gate.weight": torch.randn(3, 8),
        "p.experts.gate_up_proj": torch.randn(3, 8, 8),
        "p.experts.down_proj": torch.randn(3, 8, 4),
    }
    state = moe_state_from_hf(fused.__getitem__, "p.", cfg)
    assert torch.equal(state["experts.gate_up_proj"], fused["p.experts.gate_up_proj"])
    per_expert = moe_state_to_hf(state, "p.", cfg)
    assert torch.equal(per_expert["p.experts.2.up_proj.weight"], fused["p.experts.gate_up_proj"][2, 4:])


def test_deepseek_layout_with_bias_and_shared_experts_round_trips() -> None:
    cfg = MoEConfig(
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=8,
        router="sigmoid_group_limited",
        n_group=2,
        topk_group=1,
        num_shared_experts=1,
    )
    block = MoEBlock(16, cfg)
    block.init_weights(torch.Generator().manual_seed(0))
    block.router.e_score_correction_bias.uniform_()  # type: ignore[union-attr]
    prefix = "model.layers.5.mlp."
    hf = moe_state_to_hf(block.state_dict(), prefix, cfg)
    assert f"{prefix}gate.e_score_correction_bias" in hf
    assert f"{prefix}shared_experts.up_proj.weight" in hf
    back = moe_state_from_hf(hf.__getitem__, prefix, cfg)
    for key, tensor in block.state_dict().items():
        assert torch.equal(back[key], tensor), key


def test_missing_key_propagates_naming_it() -> None:
    cfg = MoEConfig(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=4)
    with pytest.raises(KeyError, match=r"experts\.0\.gate_proj"):
        moe_state_from_hf({"p.gate.weight": torch.zeros(2, 8)}.__getitem__, "p.", cfg)
