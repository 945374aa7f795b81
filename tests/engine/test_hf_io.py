"""Hugging Face checkpoint folders: sharded reading and writing, and one clear error per kind of bad folder."""

import json
from pathlib import Path

import pytest
import torch
import xtrain
from safetensors.torch import load_file, save_file
from xtrain.errors import CheckpointError
from xtrain.model.hf import INDEX_FILE, to_hf_state

from .hf_reference import TinyModel, build_reference, save_reference

MOE = TinyModel(moe=True, mlp_only_layers=(0,))


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-MoE checkpoint written by transformers (one file)."""
    return save_reference(build_reference(MOE, seed=3), tmp_path_factory.mktemp("hf") / "moe")


def _copy_folder(source: Path, target: Path) -> Path:
    target.mkdir()
    for file in source.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    return target


def _assert_same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> None:
    a_state, b_state = a.state_dict(), b.state_dict()
    assert a_state.keys() == b_state.keys()
    for key, tensor in a_state.items():
        assert torch.equal(tensor, b_state[key]), key


def test_loads_a_checkpoint_sharded_by_transformers(hf_folder: Path, tmp_path: Path) -> None:
    reference = build_reference(MOE, seed=3)
    reference.save_pretrained(tmp_path / "sharded", max_shard_size="60KB")
    index = json.loads((tmp_path / "sharded" / INDEX_FILE).read_text())
    assert len(set(index["weight_map"].values())) > 2
    # The experts of one layer straddle a shard boundary: the loader must follow them into the next file.
    layer_files = {f for key, f in index["weight_map"].items() if key.startswith("model.layers.1.mlp.experts.")}
    assert len(layer_files) > 1
    _assert_same_parameters(xtrain.load_hf(tmp_path / "sharded"), xtrain.load_hf(hf_folder))


def test_save_hf_shards_above_the_threshold_and_reads_back(hf_folder: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = xtrain.load_hf(hf_folder)
    xtrain.save_hf(model, tmp_path / "out", max_shard_bytes=50_000)
    shards = sorted((tmp_path / "out").glob("model-*-of-*.safetensors"))
    assert len(shards) > 2 and not (tmp_path / "out" / "model.safetensors").exists()
    index = json.loads((tmp_path / "out" / INDEX_FILE).read_text())
    assert set(index["weight_map"].values()) == {s.name for s in shards}
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in to_hf_state(model).values())
    _assert_same_parameters(xtrain.load_hf(tmp_path / "out"), model)
    # Saving again, unsharded, into the same folder replaces the shards and the index instead of mixing them.
    xtrain.save_hf(model, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "model.safetensors"]
    _assert_same_parameters(xtrain.load_hf(tmp_path / "out"), model)
    xtrain.save_hf(model, tmp_path / "out", max_shard_bytes=50_000)
    # transformers reads the same sharded folder into the same weights.
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", experts_implementation="eager")
    original = AutoModelForCausalLM.from_pretrained(hf_folder, experts_implementation="eager")
    _assert_same_parameters(reloaded, original)


def test_loads_in_the_requested_dtype(hf_folder: Path) -> None:
    model = xtrain.load_hf(hf_folder, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    fp32 = xtrain.load_hf(hf_folder)
    torch.testing.assert_close(model.embed_tokens.weight, fp32.embed_tokens.weight.to(torch.bfloat16))


def test_another_architecture_is_refused(hf_folder: Path, tmp_path: Path) -> None:
    folder = _copy_folder(hf_folder, tmp_path / "llama")
    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=["LlamaForCausalLM"], model_type="llama")
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config\.json.*'LlamaForCausalLM'.*not supported"):
        xtrain.load_hf(folder)


def test_an_unsupported_feature_is_refused(hf_folder: Path, tmp_path: Path) -> None:
    folder = _copy_folder(hf_folder, tmp_path / "sliding")
    config = json.loads((folder / "config.json").read_text())
    config.update(use_sliding_window=True, sliding_window=16)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config\.json.*use_sliding_window"):
        xtrain.load_hf(folder)


def test_missing_config_and_bad_json(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"empty/config\.json does not exist"):
        xtrain.load_hf(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"bad/config\.json is not readable JSON"):
        xtrain.load_hf(tmp_path / "bad")
    with pytest.raises(CheckpointError, match="is not a folder"):
        xtrain.load_hf(tmp_path / "nowhere")


def test_missing_weights_file(hf_folder: Path, tmp_path: Path) -> None:
    folder = _copy_folder(hf_folder, tmp_path / "noweights")
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"holds neither model\.safetensors nor model\.safetensors\.index\.json"):
        xtrain.load_hf(folder)


def test_missing_shard_is_named(tmp_path: Path) -> None:
    build_reference(MOE, seed=3).save_pretrained(tmp_path / "sharded", max_shard_size="60KB")
    victim = sorted((tmp_path / "sharded").glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(CheckpointError, match=rf"shard .*{victim.name} named by .*index\.json is missing"):
        xtrain.load_hf(tmp_path / "sharded")


def _rewrite_weights(folder: Path, change: "dict[str, torch.Tensor | None]") -> None:
    tensors = load_file(str(folder / "model.safetensors"))
    for key, value in change.items():
        if value is None:
            del tensors[key]
        else:
            tensors[key] = value
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_missing_key_is_named(hf_folder: Path, tmp_path: Path) -> None:
    folder = _copy_folder(hf_folder, tmp_path / "missing")
    _rewrite_weights(folder, {"model.layers.1.mlp.experts.5.up_proj.weight": None})
    with pytest.raises(CheckpointError, match=r"model\.safetensors lacks the key 'model\.layers\.1\.mlp\.experts\.5"):
        xtrain.load_hf(folder)


def test_unexpected_key_is_named(hf_folder: Path, tmp_path: Path) -> None:
    folder = _copy_folder(hf_folder, tmp_path / "unexpected")
    _rewrite_weights(folder, {"model.layers.0.mlp.experts.0.up_proj.weight": torch.zeros(2, 2)})
    with pytest.raises(
        CheckpointError, match=r"model\.safetensors holds the key 'model\.layers\.0\.mlp\.experts\.0\.up_proj"
    ):
        xtrain.load_hf(folder)


def test_unexpected_expert_key_in_an_moe_layer_is_named(hf_folder: Path, tmp_path: Path) -> None:
    folder = _copy_folder(hf_folder, tmp_path / "extra_expert")
    _rewrite_weights(folder, {"model.layers.2.mlp.experts.8.up_proj.weight": torch.zeros(32, 64)})
    with pytest.raises(CheckpointError, match=r"holds the key 'model\.layers\.2\.mlp\.experts\.8\.up_proj\.weight'"):
        xtrain.load_hf(folder)


@pytest.mark.parametrize(
    "key", ["model.layers.2.self_attn.k_proj.weight", "model.layers.1.mlp.experts.3.down_proj.weight"]
)
def test_shape_mismatch_is_named(hf_folder: Path, tmp_path: Path, key: str) -> None:
    folder = _copy_folder(hf_folder, tmp_path / "shape")
    tensors = load_file(str(folder / "model.safetensors"))
    _rewrite_weights(folder, {key: torch.zeros(tensors[key].shape[0] + 1, tensors[key].shape[1])})
    with pytest.raises(CheckpointError, match=rf"model\.safetensors: '{key}' has shape"):
        xtrain.load_hf(folder)


def test_unreadable_weights_file_is_named(hf_folder: Path, tmp_path: Path) -> None:
    folder = _copy_folder(hf_folder, tmp_path / "garbage")
    (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match=r"garbage/model\.safetensors is not a readable safetensors file"):
        xtrain.load_hf(folder)


def test_errors_are_value_errors() -> None:
    assert issubclass(CheckpointError, ValueError)


def test_loads_the_fused_expert_layout_too(hf_folder: Path, tmp_path: Path) -> None:
    """transformers 5 can also write its in-memory layout (experts.gate_up_proj [E, 2F, D]); accept it."""
    reference = build_reference(MOE, seed=3)
    reference.save_pretrained(tmp_path / "fused", save_original_format=False)
    keys = load_file(str(tmp_path / "fused" / "model.safetensors")).keys()
    assert "model.layers.1.mlp.experts.gate_up_proj" in keys
    _assert_same_parameters(xtrain.load_hf(tmp_path / "fused"), xtrain.load_hf(hf_folder))
