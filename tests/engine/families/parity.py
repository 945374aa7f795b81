"""Shared steps of the family parity tests: a packed row against transformers run on each document alone."""

from pathlib import Path

import torch
import torch.nn.functional as F
import xtrain
from safetensors import safe_open
from xtrain.model.hf import state_to_hf

from .hf_reference import hf_gradients

LOGITS_ATOL = 1e-4
GRAD_RTOL = 1e-4


def packed_batch(lengths: list[int], vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids_1T = torch.randint(0, vocab, (1, sum(lengths)), generator=generator)
    targets_T = torch.randint(0, vocab, (sum(lengths),), generator=generator)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return ids_1T, targets_T, cu


def assert_logits_and_gradients_match(reference: torch.nn.Module, folder: Path, lengths: list[int], seed: int) -> None:
    """xtrain loaded from ``folder`` (saved from ``reference``) against ``reference``: logits of the packed row
    to 1e-4 against each document run alone, and every parameter's gradient of a summed cross-entropy to 1e-4
    relative error, with the key sets compared both ways."""
    model = xtrain.load_hf(folder)
    vocab = model.config.vocab_size
    ids_1T, targets_T, cu = packed_batch(lengths, vocab, seed)
    logits_1TV = model(ids_1T, cu)
    F.cross_entropy(logits_1TV[0], targets_T, reduction="sum").backward()

    start, pieces = 0, []
    for length in lengths:
        piece = slice(start, start + length)
        doc_logits = reference(input_ids=ids_1T[:, piece]).logits
        F.cross_entropy(doc_logits[0], targets_T[piece], reduction="sum").backward()
        pieces.append(doc_logits)
        start += length
    expected_1TV = torch.cat(pieces, dim=1)
    assert logits_1TV.shape == expected_1TV.shape == (1, sum(lengths), vocab)
    max_diff = (logits_1TV - expected_1TV).abs().max().item()
    assert max_diff <= LOGITS_ATOL, f"logits differ by {max_diff:.3g}"

    ours = state_to_hf(model.config, {name: p.grad for name, p in model.named_parameters() if p.grad is not None})
    theirs = hf_gradients(reference)
    assert set(ours) == set(theirs), f"only xtrain: {set(ours) - set(theirs)}; only HF: {set(theirs) - set(ours)}"
    for key, expected in theirs.items():
        if expected.norm() == 0:
            assert ours[key].norm() == 0, f"{key}: HF gradient is zero, xtrain's is not"
            continue
        error = (ours[key] - expected).norm() / expected.norm()
        assert error <= GRAD_RTOL, f"{key}: relative gradient error {error:.3g}"


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            out.update({key: handle.get_tensor(key) for key in handle.keys()})  # noqa: SIM118
    return out


def assert_save_loads_in_transformers(reference: torch.nn.Module, tmp_path: Path, lengths: list[int]) -> None:
    """load_hf -> save_hf -> transformers' from_pretrained gives identical logits, and every tensor of the
    original checkpoint comes back bit for bit under the same key."""
    from transformers import AutoModelForCausalLM

    source = tmp_path / "source"
    reference.save_pretrained(source)
    xtrain.save_hf(xtrain.load_hf(source), tmp_path / "exported")
    reloaded = AutoModelForCausalLM.from_pretrained(
        tmp_path / "exported", attn_implementation="eager", experts_implementation="eager"
    ).eval()
    assert type(reloaded) is type(reference)
    ids_1T, _, _ = packed_batch(lengths, reference.config.vocab_size, seed=7)
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids_1T).logits, reference(input_ids=ids_1T).logits)
    original, exported = tensors(source), tensors(tmp_path / "exported")
    assert set(original) == set(exported)
    for key, tensor in original.items():
        assert exported[key].dtype == tensor.dtype and torch.equal(exported[key], tensor), key
