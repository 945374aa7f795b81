"""Hugging Face checkpoint I/O for Qwen3ForCausalLM, Qwen3MoeForCausalLM, DeepseekV3ForCausalLM (also Kimi K2)
and GptOssForCausalLM folders.

``load_hf(path)`` reads config.json and model.safetensors (or the shards named by model.safetensors.index.json),
builds the model on the meta device, materialises it empty, and fills it one shard at a time, so the host never
holds more than the model plus the tensors being copied. ``load_hf_into(model, path)`` fills a model that exists
already, also one whose parameters are sharded DTensors (FSDP2): each rank reads one tensor at a time and keeps
only its own shard of it, so no rank ever holds the full model: the files are read tensor by tensor
(``xtrain.model.safetensors_file``, never mapped whole) and a layer's fused expert tensors are built one at a
time, so loading holds at most the model (or this rank's share of it) plus one full tensor.

``save_hf(model, path)`` writes the same format back (sharded with an index above a size threshold; from a sharded
model every rank takes part in gathering one layer at a time and rank 0 writes), with the per-expert layout that
released Hub checkpoints use and transformers 5 writes (``mlp.experts.{e}.gate_proj.weight``...). Loading then
saving reproduces every tensor bit for bit.

Which HF key holds which tensor is decided in one place per part: :func:`dense_hf_keys` for everything outside
the experts, ``xtrain.model.moe.hf_keys`` for one layer's MoE block. Every problem with a folder raises one
:class:`~xtrain.errors.CheckpointError` naming the file and the key.
"""

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path

import torch
from clusterx.fileio import write_atomically
from safetensors.torch import save_file
from torch import Tensor

from xtrain.errors import CheckpointError, ConfigError
from xtrain.model.config import ModelConfig
from xtrain.model.moe.hf_keys import iter_moe_state_from_hf, moe_state_to_hf
from xtrain.model.safetensors_file import SafetensorsFile
from xtrain.model.transformer import Transformer

CONFIG_FILE = "config.json"
SINGLE_WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TensorAssign = Callable[[Tensor, Tensor], None]
"""Writes a full tensor read from a checkpoint into a model tensor: (target, source) -> None."""
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3
"""Shard size limit of save_hf, as transformers' default "5GB" (5 GiB here; any value loads the same)."""


def dense_hf_keys(config: ModelConfig) -> dict[str, str]:
    """xtrain parameter name -> HF key, for every parameter outside the MoE blocks."""
    keys = {"embed_tokens.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
    if not config.tie_word_embeddings:
        keys["lm_head.weight"] = "lm_head.weight"
    attention_params = attention_param_names(config)
    for i in range(config.num_layers):
        ours, theirs = f"layers.{i}.", f"model.layers.{i}."
        keys[ours + "attention_norm.weight"] = theirs + "input_layernorm.weight"
        keys[ours + "ffn_norm.weight"] = theirs + "post_attention_layernorm.weight"
        for name in attention_params:
            keys[ours + "attention." + name] = theirs + "self_attn." + name
        if not config.is_moe_layer(i):
            for name in ("gate_proj.weight", "up_proj.weight", "down_proj.weight"):
                keys[ours + "mlp." + name] = theirs + "mlp." + name
    return keys


def attention_param_names(config: ModelConfig) -> list[str]:
    """Parameter names of one layer's attention, the same under ``attention.`` (xtrain) and ``self_attn.`` (HF)."""
    if config.mla is not None:
        biased = ["kv_a_proj_with_mqa", "o_proj"]
        if config.mla.q_lora_rank is None:
            names = ["q_proj.weight"]
        else:
            names = ["q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight"]
            biased.append("q_a_proj")
        names += ["kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight", "o_proj.weight"]
        return names + ([f"{name}.bias" for name in biased] if config.attention_bias else [])
    names = ["q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"]
    if config.attention_bias:
        names += ["q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias"]
    if config.qk_norm:
        names += ["q_norm.weight", "k_norm.weight"]
    if config.attention_sinks:
        names.append("sinks")
    return names


def moe_prefixes(config: ModelConfig) -> dict[str, str]:
    """xtrain MoE block prefix -> HF prefix, for every MoE layer."""
    return {f"layers.{i}.moe.": f"model.layers.{i}.mlp." for i in config.moe_layer_indices}


def state_to_hf(config: ModelConfig, state: Mapping[str, Tensor], part: str | None = None) -> dict[str, Tensor]:
    """Rename an xtrain state (parameters, or anything keyed like them, e.g. gradients) to HF keys and layout.

    Returns views of the given tensors where the layouts allow, not copies. ``part`` limits the conversion to
    one group of :func:`_save_groups` ("" for the parameters outside the layers, "layers.3." for one layer).
    """
    hf: dict[str, Tensor] = {}
    for ours, theirs in dense_hf_keys(config).items():
        if _in_part(ours, part):
            hf[theirs] = state[ours]
    for ours_prefix, theirs_prefix in moe_prefixes(config).items():
        if _in_part(ours_prefix, part):
            assert config.moe is not None  # moe_prefixes is empty without it
            block = {k[len(ours_prefix) :]: v for k, v in state.items() if k.startswith(ours_prefix)}
            hf.update(moe_state_to_hf(block, theirs_prefix, config.moe))
    return hf


def _in_part(name: str, part: str | None) -> bool:
    if part is None:
        return True
    if part == "":
        return not name.startswith("layers.")
    return name.startswith(part)


def to_hf_state(model: Transformer, part: str | None = None) -> dict[str, Tensor]:
    """The model's parameters under HF keys and layout (views, not copies)."""
    state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    return state_to_hf(model.config, state, part)


def read_hf_config(path: str | Path) -> ModelConfig:
    """The model configuration of a local HF folder (its config.json), or a CheckpointError naming the file."""
    return _read_config(Path(path))


def load_hf(path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> Transformer:
    """Load a local HF folder of one of the supported architectures into a :class:`Transformer`.

    Reads config.json (generation_config.json is ignored) and the safetensors weights; never goes to the
    network. Tensors are converted to ``dtype`` and placed on ``device``.
    """
    folder = Path(path)
    config = _read_config(folder)
    key_files = _read_weight_layout(folder)
    _check_key_sets(folder, key_files, config)
    with torch.device("meta"):
        model = Transformer(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    _fill_from_shards(model, folder, key_files, _expected_hf_shapes(config), _copy)
    return model


def load_hf_into(model: Transformer, path: str | Path, assign: TensorAssign | None = None) -> None:
    """Fill the parameters of an existing ``model`` from a local HF folder, one tensor at a time.

    The folder's config.json must describe the same architecture and shapes as ``model.config``; the message
    names the first field that differs. ``assign(parameter, full_tensor)`` writes each tensor read (default: a
    plain copy); code that shards the model passes one that keeps only this rank's shard.
    """
    folder = Path(path)
    config = _read_config(folder)
    ignored = {"attention_backend"}  # how to compute, not what: free to differ from the folder's
    ours, theirs = model.config.model_dump(exclude=ignored), config.model_dump(exclude=ignored)
    differing = [field for field in ours if ours[field] != theirs[field]]
    if differing:
        field = differing[0]
        raise CheckpointError(
            f"{folder / CONFIG_FILE}: {field} is {theirs[field]!r} but the model being loaded has {ours[field]!r}"
        )
    key_files = _read_weight_layout(folder)
    _check_key_sets(folder, key_files, config)
    _fill_from_shards(model, folder, key_files, _expected_hf_shapes(config), assign or _copy)


def _expected_hf_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        reference = Transformer(config)
    return {key: tuple(t.shape) for key, t in to_hf_state(reference).items()}


def save_hf(
    model: Transformer,
    path: str | Path,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    *,
    gather: Callable[[Tensor], Tensor] | None = None,
    write: bool = True,
) -> None:
    """Write ``model`` as an HF folder (config.json + safetensors) that transformers' from_pretrained loads.

    Above ``max_shard_bytes`` the weights are split into model-0000i-of-0000N.safetensors with an index. Each
    shard is written as soon as it is full, so the host holds at most one shard of copies (one layer is
    converted at a time). Weights files of an earlier checkpoint in the folder are replaced.

    For a sharded model, code that shards it passes ``gather`` (the full tensor of a shard: a collective every
    process calls, one layer at a time) and ``write`` True on one process only.
    """
    folder = Path(path)
    try:
        hf_config = model.config.to_hf_config()
    except ConfigError as error:
        raise CheckpointError(f"cannot write {folder / CONFIG_FILE}: {error}") from None
    hf_config["dtype"] = str(model.embed_tokens.weight.dtype).removeprefix("torch.")
    if write:
        folder.mkdir(parents=True, exist_ok=True)
        for stale in [folder / SINGLE_WEIGHTS_FILE, folder / INDEX_FILE, *folder.glob("model-*-of-*.safetensors")]:
            stale.unlink(missing_ok=True)

    # Shards get numbered temporary names first: their count is known only at the end.
    written: list[tuple[Path, list[str]]] = []
    pending: dict[str, Tensor] = {}
    pending_bytes = total_bytes = 0

    def flush() -> None:
        temporary = folder / f".xtrain-shard-{len(written):05d}.safetensors.tmp"
        save_file(pending, str(temporary), metadata={"format": "pt"})
        written.append((temporary, sorted(pending)))
        pending.clear()

    for part in _save_groups(model.config):
        # From a sharded model, every rank gathers this part's full tensors (a collective), rank 0 keeps them.
        state = {name: (gather or _same)(t) for name, t in model.state_dict().items() if _in_part(name, part)}
        if not write:
            continue
        for key, tensor in state_to_hf(model.config, state, part).items():
            size = tensor.numel() * tensor.element_size()
            if pending and pending_bytes + size > max_shard_bytes:
                flush()
                pending_bytes = 0
            pending[key] = tensor.to("cpu").contiguous()
            pending_bytes += size
            total_bytes += size
    if not write:
        return
    flush()

    if len(written) == 1:
        written[0][0].replace(folder / SINGLE_WEIGHTS_FILE)
    else:
        weight_map: dict[str, str] = {}
        for number, (temporary, keys) in enumerate(written, start=1):
            name = f"model-{number:05d}-of-{len(written):05d}.safetensors"
            temporary.replace(folder / name)
            weight_map.update(dict.fromkeys(keys, name))
        index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
        write_atomically(folder / INDEX_FILE, json.dumps(index, indent=2) + "\n")
    write_atomically(folder / CONFIG_FILE, json.dumps(hf_config, indent=2, sort_keys=True) + "\n")


def _save_groups(config: ModelConfig) -> list[str]:
    # "" = the parameters outside the layers; one group per layer keeps conversion memory to one layer.
    return ["", *(f"layers.{i}." for i in range(config.num_layers))]


def _read_config(folder: Path) -> ModelConfig:
    config_path = folder / CONFIG_FILE
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a folder: pass the folder holding config.json and *.safetensors")
    try:
        hf_config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{config_path} does not exist: not a Hugging Face model folder") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{config_path} is not readable JSON: {error}") from None
    if not isinstance(hf_config, dict):
        raise CheckpointError(f"{config_path} must hold a JSON object, found {type(hf_config).__name__}")
    try:
        return ModelConfig.from_hf_config(hf_config)
    except (ConfigError, ValueError) as error:
        raise CheckpointError(f"{config_path}: {error}") from None


def _read_weight_layout(folder: Path) -> dict[str, Path]:
    """HF key -> the safetensors file holding it, as the files themselves say (headers only)."""
    index_path = folder / INDEX_FILE
    if index_path.exists():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
            raise CheckpointError(f"{index_path} is not a readable safetensors index ({error!r})") from None
        files = sorted(set(weight_map.values()))
        promised = {name: next(k for k, v in weight_map.items() if v == name) for name in files}
        for name in files:
            if not (folder / name).is_file():
                raise CheckpointError(
                    f"shard {folder / name} named by {index_path} is missing (it should hold {promised[name]!r})"
                )
    elif (folder / SINGLE_WEIGHTS_FILE).is_file():
        weight_map, files = None, [SINGLE_WEIGHTS_FILE]
    else:
        raise CheckpointError(f"{folder} holds neither {SINGLE_WEIGHTS_FILE} nor {INDEX_FILE}")
    key_files: dict[str, Path] = {}
    for name in files:
        shard = folder / name
        for key in _shard_keys(shard):
            key_files[key] = shard
    if weight_map is not None:
        for key, name in weight_map.items():
            if key not in key_files:
                raise CheckpointError(f"{folder / name} lacks the key {key!r} that {index_path} places there")
    return key_files


def _shard_keys(shard: Path) -> list[str]:
    try:
        with SafetensorsFile(shard) as handle:
            return handle.keys()
    except Exception as error:  # safetensors raises its own error types for every kind of bad file
        raise CheckpointError(f"{shard} is not a readable safetensors file: {error}") from None


def _check_key_sets(folder: Path, key_files: Mapping[str, Path], config: ModelConfig) -> None:
    """Up-front check of the keys outside the experts; expert keys are checked as they are read, because the
    MoE converter accepts more than one expert layout."""
    where = folder / (INDEX_FILE if (folder / INDEX_FILE).exists() else SINGLE_WEIGHTS_FILE)
    missing = [key for key in dense_hf_keys(config).values() if key not in key_files]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(
            f"{where} lacks the key {missing[0]!r}{more} that a {config.hf_architecture} of this config.json needs"
        )
    dense = set(dense_hf_keys(config).values())
    moe = tuple(moe_prefixes(config).values())
    for key, shard in key_files.items():
        if key not in dense and not key.startswith(moe) and not _ignorable(key, config):
            raise CheckpointError(_unexpected(shard, key, config))


def _ignorable(key: str, config: ModelConfig) -> bool:
    # Tied checkpoints sometimes store the output projection anyway; it is the embedding, so skip it.
    if key == "lm_head.weight" and config.tie_word_embeddings:
        return True
    # DeepSeek-V3 checkpoints store their multi-token-prediction layers after the decoder's (model.layers.61.*);
    # the model does not build them, and transformers skips them the same way.
    return config.num_nextn_predict_layers > 0 and _layer_index(key) in range(
        config.num_layers, config.num_layers + config.num_nextn_predict_layers
    )


def _layer_index(key: str) -> int | None:
    parts = key.split(".")
    if len(parts) > 2 and parts[0] == "model" and parts[1] == "layers" and parts[2].isdigit():
        return int(parts[2])
    return None


def _unexpected(shard: Path, key: str, config: ModelConfig) -> str:
    return f"{shard} holds the key {key!r}, which a {config.hf_architecture} of this config.json does not have"


def _fill_from_shards(
    model: Transformer,
    folder: Path,
    key_files: Mapping[str, Path],
    expected_shapes: Mapping[str, tuple[int, ...]],
    assign: TensorAssign,
) -> None:
    config = model.config
    params = dict(model.state_dict(keep_vars=True))
    dense = {theirs: ours for ours, theirs in dense_hf_keys(config).items()}
    prefixes = moe_prefixes(config)
    filled: set[str] = set()
    consumed: set[str] = set()
    with torch.no_grad():
        for shard in sorted(set(key_files.values())):
            with ExitStack() as stack:
                reader = _ShardReader(shard, key_files, expected_shapes, stack, consumed)
                for key in reader.keys_in_shard():
                    if key in consumed:
                        continue
                    if key in dense:
                        _copy_into(params[dense[key]], reader.get(key), shard, key, assign)
                        filled.add(dense[key])
                        continue
                    for ours_prefix, theirs_prefix in prefixes.items():
                        if key.startswith(theirs_prefix):
                            # The whole layer is converted when its first key turns up.
                            _fill_moe_layer(params, ours_prefix, theirs_prefix, config, reader, assign=assign)
                            filled.update(name for name in params if name.startswith(ours_prefix))
                            break
    leftover = sorted(key for key in key_files if key not in consumed and not _ignorable(key, config))
    if leftover:
        raise CheckpointError(_unexpected(key_files[leftover[0]], leftover[0], config))
    unfilled = sorted(set(params) - filled)
    if unfilled:  # an internal inconsistency between the key maps, not a user error
        raise CheckpointError(f"loading {folder} left {unfilled[:3]} unset; the key mapping is incomplete")


def _fill_moe_layer(
    params: Mapping[str, Tensor],
    ours_prefix: str,
    theirs_prefix: str,
    config: ModelConfig,
    reader: "_ShardReader",
    *,
    assign: TensorAssign,
) -> None:
    assert config.moe is not None  # moe_prefixes is empty without it
    expected = {name for name in params if name.startswith(ours_prefix)}
    filled: set[str] = set()
    # One block tensor at a time, each dropped once assigned: loading holds at most one full tensor of the layer.
    for name, tensor in _converted_moe_layer(theirs_prefix, config, reader):
        target = params.get(ours_prefix + name)
        if target is None:
            raise CheckpointError(f"{reader.shard}: the MoE tensors under {theirs_prefix!r} do not fill the layer")
        _copy_into(target, tensor, reader.shard, f"{theirs_prefix}* ({name})", assign)
        filled.add(ours_prefix + name)
        del tensor  # before the next one is built (the loop variable would keep it alive)
    if filled != expected:
        raise CheckpointError(f"{reader.shard}: the MoE tensors under {theirs_prefix!r} do not fill the layer")


def _converted_moe_layer(
    theirs_prefix: str, config: ModelConfig, reader: "_ShardReader"
) -> Iterator[tuple[str, Tensor]]:
    # Errors of the conversion itself (not of assigning its tensors) become one CheckpointError naming the file.
    assert config.moe is not None  # only MoE layers get here
    try:
        yield from iter_moe_state_from_hf(reader.get, theirs_prefix, config.moe)
    except KeyError as error:
        where = reader.folder / (INDEX_FILE if reader.sharded else SINGLE_WEIGHTS_FILE)
        raise CheckpointError(
            f"{where} lacks the key {error.args[0]!r} that a {config.hf_architecture} of this config.json needs"
        ) from None
    except (RuntimeError, ValueError) as error:
        if isinstance(error, CheckpointError):
            raise
        raise CheckpointError(f"{reader.shard}: the experts under {theirs_prefix!r} do not convert: {error}") from None


class _ShardReader:
    """Reads tensors of the shard being loaded; a key stored in another shard (an MoE layer whose experts
    straddle a shard boundary) is read from that file on demand, one tensor at a time. Records every key it
    hands out, so keys nobody asked for can be reported as unexpected."""

    def __init__(
        self,
        shard: Path,
        key_files: Mapping[str, Path],
        expected_shapes: Mapping[str, tuple[int, ...]],
        stack: ExitStack,
        consumed: set[str],
    ) -> None:
        self.shard = shard
        self.folder = shard.parent
        self.sharded = (shard.parent / INDEX_FILE).exists()
        self._key_files = key_files
        self._expected = expected_shapes
        self._stack = stack
        self._consumed = consumed
        self._handles: dict[Path, SafetensorsFile] = {}

    def _handle(self, file: Path) -> SafetensorsFile:
        if file not in self._handles:
            try:
                self._handles[file] = self._stack.enter_context(SafetensorsFile(file))
            except Exception as error:  # safetensors raises its own error types for every kind of bad file
                raise CheckpointError(f"{file} is not a readable safetensors file: {error}") from None
        return self._handles[file]

    def keys_in_shard(self) -> Iterator[str]:
        return iter(sorted(key for key, file in self._key_files.items() if file == self.shard))

    def get(self, key: str) -> Tensor:
        """The tensor stored under ``key``; KeyError when no file holds it (the MoE converter's contract)."""
        file = self._key_files.get(key)
        if file is None:
            raise KeyError(key)
        try:
            tensor = self._handle(file).read(key)
        except CheckpointError:
            raise
        except Exception as error:
            raise CheckpointError(f"{file}: the tensor {key!r} is not readable: {error}") from None
        expected = self._expected.get(key)
        if expected is not None and tuple(tensor.shape) != expected:
            raise CheckpointError(
                f"{file}: {key!r} has shape {list(tensor.shape)}, but config.json implies {list(expected)}"
            )
        self._consumed.add(key)
        return tensor


def _copy_into(target: Tensor, source: Tensor, file: Path, key: str, assign: TensorAssign) -> None:
    if target.shape != source.shape:
        raise CheckpointError(
            f"{file}: {key!r} has shape {list(source.shape)}, but the model expects {list(target.shape)}"
        )
    assign(target, source)


def _copy(target: Tensor, source: Tensor) -> None:
    target.copy_(source)


def _same(tensor: Tensor) -> Tensor:
    return tensor
