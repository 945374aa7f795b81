"""Named DeepSeek-V3 / Kimi K2 / GPT-OSS sizes against the published counts, their FLOPs (MLA's attention widths,
sliding windows), `xtrain info`, quantised and multi-token-prediction checkpoints, initialisation part by part,
and the packed-row attention paths against a textbook reference."""

import itertools
import json
from pathlib import Path

import pytest
import torch
import xtrain
from click.testing import CliRunner
from safetensors.torch import load_file, save_file
from xtrain.cli import main
from xtrain.errors import CheckpointError
from xtrain.model.attention_backends import attention_function
from xtrain.model.document_masked import masked_attention_per_document
from xtrain.model.documents import PackedDocuments
from xtrain.model.flops import attention_training_flops, causal_attention_pairs
from xtrain.model.hf import read_hf_config
from xtrain.model.sizes import count_parameters, model_config
from xtrain.model.transformer import Transformer

from .hf_reference import build_deepseek_v3, build_gpt_oss


@pytest.mark.parametrize(
    ("size", "total_billions", "active_billions", "without_input_embedding"),
    # Published: DeepSeek-V3 "671B total, 37B activated" (the MTP module's 14B excluded); Kimi K2 "1T total
    # (1.04T), 32B activated"; gpt-oss-20b "21B (20.91B) total, 3.6B (3.61B) active", gpt-oss-120b "117B
    # (116.83B) total, 5.1B (5.13B) active", where OpenAI counts the unembedding but not the embedding lookup.
    [
        ("deepseek-v3-671b", 671.0, 37.0, False),
        ("kimi-k2-1t", 1040.0, 32.0, False),
        ("gpt-oss-20b", 20.91, 3.61, True),
        ("gpt-oss-120b", 116.83, 5.13, True),
    ],
)
def test_named_sizes_match_the_published_counts(
    size: str, total_billions: float, active_billions: float, without_input_embedding: bool
) -> None:
    counts = count_parameters(model_config(size))
    active = counts.active_without_input_embedding if without_input_embedding else counts.active
    assert counts.total / 1e9 == pytest.approx(total_billions, rel=0.015)
    assert active / 1e9 == pytest.approx(active_billions, rel=0.03)


def test_sliding_window_pairs_and_mla_attention_flops() -> None:
    # A window of 2 over 5 tokens keeps 1 + 2 + 2 + 2 + 2 pairs; a window longer than the document keeps all.
    assert causal_attention_pairs([5], window=2) == 9
    assert causal_attention_pairs([5, 3], window=8) == causal_attention_pairs([5, 3]) == 21
    config = model_config("gpt-oss-20b")
    sliding, full = causal_attention_pairs([4096], 128), causal_attention_pairs([4096])
    per_pair = 6 * 64 * (64 + 64)
    assert attention_training_flops(config, [4096]) == per_pair * 12 * (sliding + full)
    # MLA: QKᵀ over qk_nope + qk_rope = 192, P·V over v_head_dim = 128.
    deepseek = model_config("deepseek-v3-671b")
    assert attention_training_flops(deepseek, [10]) == 6 * 128 * (192 + 128) * 61 * 55


def test_xtrain_info_shows_the_family_sizes() -> None:
    for size in ("deepseek-v3-671b", "kimi-k2-1t", "gpt-oss-20b", "gpt-oss-120b"):
        result = CliRunner().invoke(main, ["info", "--model", size, "--json"])
        assert result.exit_code == 0, result.output
        figures = json.loads(result.output)
        counts = count_parameters(model_config(size))
        assert figures["parameters_total"] == counts.total
        assert figures["parameters_active_without_input_embedding"] == counts.active_without_input_embedding
    text = CliRunner().invoke(main, ["info", "--model", "gpt-oss-120b"]).output
    assert "GptOssForCausalLM" in text and "without input emb." in text


def test_mxfp4_checkpoint_is_refused_with_its_method(tmp_path: Path) -> None:
    build_gpt_oss(0, num_hidden_layers=1, layer_types=["full_attention"]).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["router"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"quant_method='mxfp4'.*unquantised.*BF16"):
        xtrain.load_hf(tmp_path)


def test_multi_token_prediction_layers_are_skipped_on_load(tmp_path: Path) -> None:
    """Published DeepSeek-V3 stores its MTP layer as model.layers.61.*; like transformers, loading skips it."""
    reference = build_deepseek_v3(0, num_hidden_layers=2, num_nextn_predict_layers=1)
    reference.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.2.eh_proj.weight"] = torch.zeros(64, 128)
    tensors["model.layers.2.mlp.gate.weight"] = torch.zeros(8, 64)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    assert read_hf_config(tmp_path).num_nextn_predict_layers == 1
    model = xtrain.load_hf(tmp_path)
    ids_1T = torch.randint(0, 96, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids_1T), reference(input_ids=ids_1T).logits, atol=1e-4, rtol=0)
    # An unknown key inside the decoder's layers is still an error.
    tensors["model.layers.1.self_attn.extra.weight"] = torch.zeros(2)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"extra\.weight"):
        xtrain.load_hf(tmp_path)


@pytest.mark.parametrize("family", ["deepseek_v3", "gpt_oss"])
def test_init_weights_writes_every_parameter_part_by_part(family: str, tmp_path: Path) -> None:
    reference = build_deepseek_v3(0) if family == "deepseek_v3" else build_gpt_oss(0)
    reference.save_pretrained(tmp_path)
    config = read_hf_config(tmp_path)
    with torch.device("meta"):
        model = Transformer(config)
    model.to_empty(device="cpu")
    for tensor in model.state_dict().values():
        tensor.fill_(float("nan"))
    model.init_weights(seed=3)
    assert all(bool(t.isfinite().all()) for t in model.state_dict().values())
    twin = Transformer(config)
    for name in twin.init_part_names():
        twin.init_part(name, seed=3)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, twin.state_dict()[name]), name


def _textbook(  # noqa: PLR0917 (the attention arguments plus the two extras)
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int | None, sinks: torch.Tensor | None
) -> torch.Tensor:
    """One document, [L, H, d] inputs: softmax over the allowed keys plus the sink logit, by hand."""
    length, heads, _ = q.shape
    k = k.repeat_interleave(heads // k.shape[1], dim=1)
    v = v.repeat_interleave(heads // v.shape[1], dim=1)
    out = torch.zeros(length, heads, v.shape[-1], dtype=torch.float64)
    for h in range(heads):
        for i in range(length):
            keys = [j for j in range(i + 1) if window is None or i - j < window]
            logits = torch.stack([(q[i, h] * k[j, h]).sum() * scale for j in keys]).double()
            extra = sinks[h].double().exp() if sinks is not None else 0.0
            weights = logits.exp() / (logits.exp().sum() + extra)
            out[i, h] = sum(w * v[j, h].double() for w, j in zip(weights, keys, strict=True))
    return out


@pytest.mark.parametrize(("window", "with_sinks"), [(None, True), (3, True), (3, False)])
def test_masked_attention_matches_a_textbook_reference_per_document(window: int | None, with_sinks: bool) -> None:
    generator = torch.Generator().manual_seed(0)
    lengths = [5, 1, 7]
    q = torch.randn(13, 4, 6, generator=generator, dtype=torch.float64)
    k = torch.randn(13, 2, 6, generator=generator, dtype=torch.float64)
    v = torch.randn(13, 2, 6, generator=generator, dtype=torch.float64)
    sinks = torch.randn(4, generator=generator, dtype=torch.float64) if with_sinks else None
    docs = PackedDocuments.from_lengths(lengths, torch.device("cpu"))
    got = masked_attention_per_document(q, k, v, docs, 0.4, window, sinks)
    starts = [0, 5, 6, 13]
    want = torch.cat([_textbook(q[a:b], k[a:b], v[a:b], 0.4, window, sinks) for a, b in itertools.pairwise(starts)])
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


def test_sdpa_takes_a_value_width_different_from_the_query_key_width() -> None:
    generator = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 9, 4, 12, generator=generator).unbind(0)
    v = torch.randn(9, 4, 5, generator=generator)
    docs = PackedDocuments.from_lengths([4, 5], torch.device("cpu"))
    got = attention_function("sdpa")(q, k, v, docs, 0.3)
    assert got.shape == (9, 4, 5)
    want = masked_attention_per_document(q, k, v, docs, 0.3, None, None)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
