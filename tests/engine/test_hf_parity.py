"""xtrain against transformers: logits and gradients on packed multi-document rows, for Qwen3 and Qwen3-MoE
in several shapes; checkpoints written by xtrain load in transformers with identical logits and round-trip
bit-exactly."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import xtrain
from safetensors import safe_open
from xtrain.model.hf import state_to_hf

from .hf_reference import TinyModel, build_reference, hf_gradients_in_hub_layout, save_reference

LOGITS_ATOL = 1e-4
GRAD_RTOL = 1e-4

CASES = {
    "dense-mha-untied": (TinyModel(moe=False, heads=4, kv_heads=4), [6, 11, 3]),
    "dense-gqa2-tied": (TinyModel(moe=False, heads=4, kv_heads=2, tie=True), [9, 1, 7, 4]),
    "dense-mqa-bias": (TinyModel(moe=False, heads=6, kv_heads=1, extra={"attention_bias": True}), [5, 12]),
    "moe-gqa2-norm-topk": (TinyModel(moe=True, heads=4, kv_heads=2, norm_topk_prob=True), [8, 5, 10]),
    "moe-mqa-tied-no-norm-dense-first": (
        TinyModel(moe=True, heads=4, kv_heads=1, tie=True, norm_topk_prob=False, mlp_only_layers=(0,)),
        [7, 2, 9],
    ),
    "moe-sparse-step-2": (
        TinyModel(moe=True, heads=8, kv_heads=4, num_layers=4, decoder_sparse_step=2, norm_topk_prob=False),
        [10, 6],
    ),
    "moe-more-experts-than-tokens": (TinyModel(moe=True, num_experts=32, top_k=4, mlp_only_layers=(1,)), [3, 5, 2]),
}


def _packed_batch(lengths: list[int], vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids_1T = torch.randint(0, vocab, (1, sum(lengths)), generator=generator)
    targets_T = torch.randint(0, vocab, (sum(lengths),), generator=generator)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return ids_1T, targets_T, cu


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_and_gradients_match_transformers_per_document(case: str, tmp_path: Path) -> None:
    shape, lengths = CASES[case]
    seed = sorted(CASES).index(case)
    reference = build_reference(shape, seed)
    model = xtrain.load_hf(save_reference(reference, tmp_path / "hf"))
    assert model.attention_backend == "sdpa"
    ids_1T, targets_T, cu = _packed_batch(lengths, shape.vocab_size, seed)

    logits_1TV = model(ids_1T, cu)
    F.cross_entropy(logits_1TV[0], targets_T, reduction="sum").backward()

    start = 0
    reference_logits = []
    for length in lengths:
        piece = slice(start, start + length)
        doc_logits = reference(input_ids=ids_1T[:, piece]).logits
        F.cross_entropy(doc_logits[0], targets_T[piece], reduction="sum").backward()
        reference_logits.append(doc_logits)
        start += length
    expected_1TV = torch.cat(reference_logits, dim=1)
    assert logits_1TV.shape == expected_1TV.shape == (1, sum(lengths), shape.vocab_size)
    max_diff = (logits_1TV - expected_1TV).abs().max().item()
    assert max_diff <= LOGITS_ATOL, f"logits differ by {max_diff:.3g}"

    ours = state_to_hf(model.config, {name: p.grad for name, p in model.named_parameters() if p.grad is not None})
    theirs = hf_gradients_in_hub_layout(reference)
    assert set(ours) == set(theirs), f"only xtrain: {set(ours) - set(theirs)}; only HF: {set(theirs) - set(ours)}"
    for key, expected in theirs.items():
        error = (ours[key] - expected).norm() / expected.norm().clamp_min(1e-30)
        if expected.norm() == 0:
            assert ours[key].norm() == 0, f"{key}: HF gradient is zero, xtrain's is not"
            continue
        assert error <= GRAD_RTOL, f"{key}: relative gradient error {error:.3g}"


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            out.update({key: handle.get_tensor(key) for key in handle.keys()})  # noqa: SIM118
    return out


@pytest.mark.parametrize("case", ["dense-gqa2-tied", "moe-mqa-tied-no-norm-dense-first", "moe-gqa2-norm-topk"])
def test_save_hf_loads_in_transformers_with_identical_logits(case: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    shape, lengths = CASES[case]
    reference = build_reference(shape, seed=7)
    source = save_reference(reference, tmp_path / "source")
    model = xtrain.load_hf(source)
    xtrain.save_hf(model, tmp_path / "exported")

    reloaded = AutoModelForCausalLM.from_pretrained(
        tmp_path / "exported", attn_implementation="eager", experts_implementation="eager"
    ).eval()
    assert type(reloaded) is type(reference)
    ids_1T, _, _ = _packed_batch(lengths, shape.vocab_size, seed=7)
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids_1T).logits, reference(input_ids=ids_1T).logits)

    # Every tensor of the original checkpoint comes back bit for bit, under the same keys.
    original, exported = _tensors(source), _tensors(tmp_path / "exported")
    assert set(original) == set(exported)
    for key, tensor in original.items():
        assert exported[key].dtype == tensor.dtype and torch.equal(exported[key], tensor), key


@pytest.mark.slow
@pytest.mark.parametrize("case", ["dense-gqa2-tied", "moe-gqa2-norm-topk"])
def test_bf16_error_is_no_worse_than_transformers_own(case: str, tmp_path: Path) -> None:
    """In bf16 neither implementation matches fp32 exactly; xtrain's rounding error (the upcasts it keeps or
    drops) must be of the same size as transformers' own, measured against the fp32 result."""
    shape, _ = CASES[case]
    lengths = [300, 17, 200]  # long enough for rotary angles where bf16 rounding of the angle would show
    folder = save_reference(build_reference(shape, seed=11), tmp_path / "hf")
    reference_bf16 = build_reference(shape, seed=11).to(torch.bfloat16)
    ids_1T, _, cu = _packed_batch(lengths, shape.vocab_size, seed=11)
    with torch.no_grad():
        exact = xtrain.load_hf(folder)(ids_1T, cu)
        ours = xtrain.load_hf(folder, dtype=torch.bfloat16)(ids_1T, cu).float()
        pieces = torch.tensor(lengths).cumsum(0).tolist()
        theirs = torch.cat(
            [
                reference_bf16(input_ids=ids_1T[:, start:end]).logits.float()
                for start, end in zip([0, *pieces[:-1]], pieces, strict=True)
            ],
            dim=1,
        )
    our_error = (ours - exact).abs().max().item()
    their_error = (theirs - exact).abs().max().item()
    assert our_error <= 2 * their_error + 1e-3, f"bf16 error {our_error:.3g} vs transformers' {their_error:.3g}"


def test_router_stats_of_a_packed_row_give_transformers_balance_loss(tmp_path: Path) -> None:
    """The router statistics forward_hidden returns cover every token of the row: with one MoE layer, the
    load-balancing loss from them equals transformers' load_balancing_loss_func over the per-document router
    logits. (With several layers transformers averages counts over layers before multiplying, a different
    definition from the per-layer one of xtrain.model.moe.aux_loss.)"""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func
    from xtrain.model.moe.aux_loss import load_balancing_loss

    shape = TinyModel(moe=True, mlp_only_layers=(0, 2))
    reference = build_reference(shape, seed=5)
    model = xtrain.load_hf(save_reference(reference, tmp_path / "hf"))
    lengths = [9, 14, 5]
    ids_1T, _, cu = _packed_batch(lengths, shape.vocab_size, seed=5)
    with torch.no_grad():
        stats = model.forward_hidden(ids_1T, cu).router_stats
        pieces = torch.tensor(lengths).cumsum(0).tolist()
        router_logits = torch.cat(
            [
                reference(input_ids=ids_1T[:, start:end], output_router_logits=True).router_logits[0]
                for start, end in zip([0, *pieces[:-1]], pieces, strict=True)
            ]
        )
    assert len(stats) == 1 and stats[0].num_tokens == sum(lengths)
    expected = load_balancing_loss_func((router_logits,), shape.num_experts, shape.top_k)
    torch.testing.assert_close(load_balancing_loss(stats), expected, atol=1e-6, rtol=1e-5)
