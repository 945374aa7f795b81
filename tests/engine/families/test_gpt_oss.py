"""GPT-OSS (sliding-window and full layers, attention sinks, biased clamped-SwiGLU experts, top-k-then-softmax
router, YaRN) against transformers' GptOssForCausalLM on packed multi-document rows, and its checkpoints."""

from pathlib import Path
from typing import Any

import pytest

from .hf_reference import build_gpt_oss
from .parity import assert_logits_and_gradients_match, assert_save_loads_in_transformers

CASES: dict[str, tuple[dict[str, Any], list[int]]] = {
    # Window 4, shorter than every document but one; sinks on; GQA 2:1; YaRN (truncate False); untied.
    "window-shorter-than-documents": ({}, [7, 13, 3]),
    # Window 32, longer than every document (a sliding layer then equals a full one); tied; full layer first.
    "window-longer-tied": (
        {
            "sliding_window": 32,
            "tie_word_embeddings": True,
            "layer_types": ["full_attention", "sliding_attention", "full_attention"],
        },
        [9, 12, 4],
    ),
    # MQA, 16 experts top-4 (more experts than a document's tokens), plain RoPE, the published clamp limit.
    "mqa-many-experts-plain-rope": (
        {
            "num_key_value_heads": 1,
            "num_local_experts": 16,
            "num_experts_per_tok": 4,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "swiglu_limit": 7.0,
        },
        [5, 3, 10],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_and_gradients_match_transformers_per_document(case: str, tmp_path: Path) -> None:
    overrides, lengths = CASES[case]
    seed = sorted(CASES).index(case)
    reference = build_gpt_oss(seed, **overrides)
    reference.save_pretrained(tmp_path / "hf")
    assert_logits_and_gradients_match(reference, tmp_path / "hf", lengths, seed)


@pytest.mark.parametrize("case", ["window-shorter-than-documents", "window-longer-tied"])
def test_save_hf_loads_in_transformers_with_identical_logits(case: str, tmp_path: Path) -> None:
    overrides, lengths = CASES[case]
    assert_save_loads_in_transformers(build_gpt_oss(3, **overrides), tmp_path, lengths)
