"""DeepSeek-V3 (multi-head latent attention, YaRN, sigmoid group-limited MoE with shared experts) against
transformers' DeepseekV3ForCausalLM on packed multi-document rows, and its checkpoints both ways."""

from pathlib import Path
from typing import Any

import pytest

from .hf_reference import DEEPSEEK_YARN, build_deepseek_v3
from .parity import assert_logits_and_gradients_match, assert_save_loads_in_transformers

CASES: dict[str, tuple[dict[str, Any], list[int]]] = {
    # Query LoRA, one dense layer first, 4 groups of which 2 are kept, YaRN with its softmax-scale correction,
    # interleaved rope, untied.
    "qlora-dense-first-groups-yarn": ({}, [7, 13, 5]),
    # Queries projected directly, no dense layer, no group limit, plain RoPE in the rotate-half layout, tied,
    # attention biases.
    "no-qlora-tied-plain-rope": (
        {
            "q_lora_rank": None,
            "first_k_dense_replace": 0,
            "n_group": 1,
            "topk_group": 1,
            "rope_interleave": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "tie_word_embeddings": True,
            "attention_bias": True,
        },
        [9, 2, 11],
    ),
    # Two dense layers first, two shared experts, 16 experts top-4 in 8 groups of which 3 are kept, more
    # experts than the tokens of a document, value heads wider than query-key heads.
    "two-dense-shared2-wide-values": (
        {
            "num_hidden_layers": 3,
            "first_k_dense_replace": 2,
            "n_shared_experts": 2,
            "n_routed_experts": 16,
            "num_experts_per_tok": 4,
            "n_group": 8,
            "topk_group": 3,
            "v_head_dim": 24,
            "rope_parameters": {**DEEPSEEK_YARN, "factor": 8.0, "mscale_all_dim": 0.707},
        },
        [3, 10, 6],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_and_gradients_match_transformers_per_document(case: str, tmp_path: Path) -> None:
    overrides, lengths = CASES[case]
    seed = sorted(CASES).index(case)
    reference = build_deepseek_v3(seed, **overrides)
    reference.save_pretrained(tmp_path / "hf")
    assert_logits_and_gradients_match(reference, tmp_path / "hf", lengths, seed)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["qlora-dense-first-groups-yarn", "no-qlora-tied-plain-rope"])
def test_save_hf_loads_in_transformers_with_identical_logits(case: str, tmp_path: Path) -> None:
    overrides, lengths = CASES[case]
    assert_save_loads_in_transformers(build_deepseek_v3(3, **overrides), tmp_path, lengths)
