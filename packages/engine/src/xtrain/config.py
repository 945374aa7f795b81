"""The typed configuration of a training run (`xtrain train CONFIG.toml`), and how it is read.

One pydantic model per TOML section, unknown keys rejected everywhere. :func:`load_train_config` reads the file,
applies ``--set section.key=value`` overrides, resolves relative paths (against the config file's folder for the
file's own values, against the working directory for overrides) and validates; every problem becomes one
:class:`~xtrain.errors.ConfigError` that names the file and the key, with the closest valid key when a name is
misspelt. The resolved configuration is written back to the run directory as TOML (:func:`to_toml`).
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from xtrain.data.config import DataConfig, DataSource
from xtrain.errors import ConfigError
from xtrain.model.attention_backends import AttentionBackendName
from xtrain.model.moe.config import ExpertsImpl
from xtrain.parallel.checkpointing import checkpointed_layers


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(_Section):
    """``[model]``: which model to train; exactly one of ``size`` and ``hf_path``."""

    size: str | None = None
    """A named size (``xtrain info --model NAME``), initialised from ``train.seed``: e.g. ``debug``."""
    hf_path: Path | None = None
    """A local Hugging Face folder (config.json + safetensors) to start from; its config.json gives the shapes."""
    attention_backend: AttentionBackendName = "auto"
    """Attention kernel: ``auto`` picks flash_attn, then torch_varlen, then sdpa, by what can run."""
    experts_impl: ExpertsImpl = "auto"
    """Routed experts' path (MoE models; a dense model ignores it): ``auto`` picks the fastest correct one for the
    device and dtype (the fused CPU loop on the CPU, torch's grouped matmul where it runs otherwise, else one matmul
    per expert: docs/engine-moe.md); ``cpu_fused``, ``grouped_mm`` or ``loop`` forces one."""

    @model_validator(mode="after")
    def _one_source(self) -> ModelSection:
        if (self.size is None) == (self.hf_path is None):
            raise ValueError("set exactly one of model.size (a named size) and model.hf_path (a Hugging Face folder)")
        return self


class TrainSection(_Section):
    """``[train]``: length and batch of the run."""

    max_steps: int = Field(gt=0)
    """Optimizer steps to train for."""
    global_batch: int = Field(gt=0)
    """Packs per optimizer step summed over all data-parallel ranks. Each rank runs global_batch / dp packs one
    at a time, accumulating gradients, so it must be a multiple of the number of processes."""
    seed: int = 0
    """Seed of the initialisation and of the data order."""
    max_skipped_steps_in_a_row: int = Field(default=5, gt=0)
    """A step whose loss or gradient is not finite is skipped; this many skipped in a row stop the run."""


class OptimSection(_Section):
    """``[optim]``: AdamW and its learning-rate schedule."""

    lr: float = Field(default=3e-4, gt=0)
    """Peak learning rate, reached at the end of warmup."""
    min_lr: float = Field(default=0.0, ge=0)
    """Learning rate at the last step (``cosine`` and ``linear``)."""
    warmup_steps: int = Field(default=0, ge=0)
    """Steps of linear warmup from lr/warmup_steps to lr."""
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    """Decay after warmup, down to min_lr at ``train.max_steps`` (``constant`` stays at lr)."""
    weight_decay: float = Field(default=0.1, ge=0)
    """Decoupled weight decay of AdamW (applied to matrices, not to norms and biases)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW's beta1 and beta2."""
    eps: float = Field(default=1e-8, gt=0)
    """AdamW's epsilon."""
    max_grad_norm: float = Field(default=1.0, ge=0)
    """Clip the global gradient norm (over all sharded parameters) to this; 0 turns clipping off."""

    @model_validator(mode="after")
    def _check(self) -> OptimSection:
        if self.min_lr > self.lr:
            raise ValueError(f"optim.min_lr ({self.min_lr}) must not exceed optim.lr ({self.lr})")
        if not all(0 <= beta < 1 for beta in self.betas):
            raise ValueError(f"optim.betas must lie in [0, 1), got {list(self.betas)}")
        return self


class LossSection(_Section):
    """``[loss]``: the chunked cross-entropy and the router losses."""

    chunk_tokens: Literal["auto"] | int = "auto"
    """Tokens per chunk of the output projection + cross-entropy (never the full logits); ``auto`` follows a
    memory budget (see xtrain.loss)."""
    aux_loss_coef: float | None = Field(default=None, ge=0)
    """Coefficient of the global-batch load-balancing loss; None takes the model's (router_aux_loss_coef)."""
    z_loss_coef: float | None = Field(default=None, ge=0)
    """Coefficient of the router z-loss; None takes the model's."""

    @model_validator(mode="after")
    def _check(self) -> LossSection:
        if isinstance(self.chunk_tokens, int) and self.chunk_tokens <= 0:
            raise ValueError(f"loss.chunk_tokens must be 'auto' or a positive number, got {self.chunk_tokens}")
        return self


class ParallelSection(_Section):
    """``[parallel]``: how the model is spread over the processes (FSDP2 is the only data parallelism)."""

    replicate: int = Field(default=1, gt=0)
    """HSDP replicate degree: the processes form replicate groups, each sharding one copy (1 = plain FSDP)."""
    reshard_after_forward: bool = True
    """Free each layer's gathered parameters after its forward (gathered again for backward): less memory, more
    communication. The last layer and the output head are never resharded."""
    mixed_precision: Literal["auto", "bf16", "fp32"] = "auto"
    """Compute dtype: ``bf16`` (bf16 parameters, fp32 gradient reduction and master weights), ``fp32``, or
    ``auto``: bf16 on CUDA, fp32 on CPU."""
    compile: bool = False
    """Compile each decoder layer on its own with torch.compile."""
    prefetch: bool = True
    """Start gathering the next layer's parameters during the current layer's forward (previous in backward)."""
    ep_size: int = Field(default=1, ge=1)
    """Expert parallelism: each MoE layer's experts are split over this many ranks of one node, and tokens travel
    to their experts' ranks and back by all-to-all (1 = off). Must divide the processes, the processes per node and
    the number of experts (checked before any process starts, ``xtrain.parallel.layout``). With ``replicate`` > 1
    the experts are split inside each replica group and the replicas are all-reduced, as HSDP does for the rest."""
    domino_slices: int = Field(default=1, ge=1)
    """Domino-EP: each micro-batch's tokens go through every MoE layer in this many slices, so that one slice's
    all-to-all overlaps another slice's compute (1 = off; numerically the same). Only used with ``ep_size`` > 1."""


class MemorySection(_Section):
    """``[memory]``: what a layer keeps between forward and backward (see docs/engine-memory.md)."""

    checkpointing: str = "none"
    """Activation checkpointing per decoder layer: ``none``, ``full``, ``every:K`` (every K-th layer) or
    ``ratio:F`` (the first F of the layers). A checkpointed layer keeps only its inputs and recomputes the rest in
    backward (the MoE routing is saved, never recomputed)."""
    offload: bool = False
    """Move the checkpoints (each checkpointed layer's inputs) to host memory during forward, and bring them back
    one layer ahead in backward; needs checkpointed layers."""
    offload_resident_layers: int = Field(default=2, ge=2)
    """With offload: at most this many layers' checkpoints are on the device at once (2: the layer in backward
    and the one fetched ahead of it)."""

    @model_validator(mode="after")
    def _check(self) -> MemorySection:
        try:
            checkpointed = checkpointed_layers(self.checkpointing, 1000)
        except ConfigError as error:
            raise ValueError(f"memory.checkpointing: {error}") from None
        if self.offload and not checkpointed:
            raise ValueError(
                f"memory.offload moves the checkpoints of checkpointed layers to host memory, but "
                f"memory.checkpointing = {self.checkpointing!r} checkpoints none: set memory.checkpointing "
                "(e.g. 'full')"
            )
        return self


class TraceSection(_Section):
    """``[trace]``: what the run records for deeptrace beyond metrics."""

    enabled: bool = True
    """Record deeptrace spans (data, forward, backward, optimizer) and collectives per rank."""
    profile_steps: list[int] = Field(default_factory=list)
    """Steps to record with the PyTorch profiler (Kineto traces in RUN_DIR/profiler/)."""
    memory: bool = False
    """Record per rank and step, in ranks/rank-R.jsonl, the exact peak of tensor bytes on the device
    (``mem_tensor_peak_bytes``: CUDA allocator statistics; on the CPU the profiler's memory events, so not on the
    steps the Kineto profiler of ``profile_steps`` records) and the bytes sent per collective kind and link
    (``comm_bytes``, counted as ``xtrain plan`` counts them). Slower steps (every op passes a Python dispatch
    mode; compiled layers run eagerly); off, nothing changes."""


class CheckpointSection(_Section):
    """``[checkpoint]``: when the run saves a checkpoint (DCP, RUN_DIR/checkpoints/step-N/) and what it keeps."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    every_steps: int = Field(default=0, ge=0)
    """Save every this many optimizer steps, and after the last step (0: never save)."""
    keep: int = Field(default=3, ge=0)
    """Complete checkpoints kept: after each save the oldest beyond this many are deleted (0: keep all)."""
    async_save: bool = Field(default=False, alias="async")
    """The training loop waits only for the copy of the state to host memory; the files are written in the
    background (one save in flight at most: the next one waits for it)."""
    hf_every_steps: int = Field(default=0, ge=0)
    """Also write a Hugging Face folder (RUN_DIR/hf/step-N/) every this many steps, from that step's checkpoint,
    by a background process (0: never). Must be a multiple of every_steps."""

    @model_validator(mode="after")
    def _check(self) -> CheckpointSection:
        if self.hf_every_steps and (not self.every_steps or self.hf_every_steps % self.every_steps):
            raise ValueError(
                f"checkpoint.hf_every_steps ({self.hf_every_steps}) must be a multiple of checkpoint.every_steps "
                f"({self.every_steps}): the Hugging Face folder is written from that step's checkpoint"
            )
        return self


class EvalSection(_Section):
    """``[eval]``: the held-out loss during training (see docs/engine-train.md, "Evaluation")."""

    sources: list[DataSource] = Field(default_factory=list)
    """Held-out JSONL files or folders, shaped like ``data.sources`` (tokenized and packed as the training data
    is, with ``data.tokenizer`` and ``data.kind``). Empty: no evaluation."""
    every_steps: int = Field(default=0, ge=0)
    """Evaluate after every this many optimizer steps (0: only after the last step)."""
    batches: int = Field(default=8, gt=0)
    """Packs per evaluation over all ranks (a multiple of the number of processes): the same packs every time."""
    pack_tokens: int | None = Field(default=None, gt=0)
    """Tokens per evaluation pack (default: ``data.pack_tokens``)."""
    sample_prompts: list[str] = Field(default_factory=list)
    """Prompts whose greedy continuations each evaluation writes to RUN_DIR/samples.jsonl (encoded with
    ``data.tokenizer`` as pretraining text is, without the closing end-of-text token). Empty: no samples."""
    sample_tokens: int = Field(default=32, gt=0, le=4096)
    """New tokens per prompt and evaluation (fewer where the model ends the text with its eos token)."""

    @model_validator(mode="after")
    def _check(self) -> EvalSection:
        if self.sample_prompts and not self.sources:
            raise ValueError(
                "eval.sample_prompts: samples are written at each evaluation, and there is none without eval.sources"
            )
        for index, prompt in enumerate(self.sample_prompts):
            if not prompt:
                raise ValueError(f"eval.sample_prompts[{index}] is empty: a continuation needs a prompt")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.sources)


class TrackSection(_Section):
    """``[track]``: experiment trackers rank 0 reports the step records to (each an optional extra of xtrain)."""

    tensorboard: bool = False
    """Event files in RUN_DIR/tensorboard/ (``xtrain[tensorboard]``)."""
    mlflow: str | None = None
    """An MLflow tracking URI: a local folder or a ``sqlite:///`` store (``xtrain[mlflow]``)."""
    wandb: Literal["offline"] | None = None
    """``offline``: a W&B offline run in RUN_DIR/wandb, for ``wandb sync`` later (``xtrain[wandb]``)."""


class PlanSection(_Section):
    """``[plan]``: the cluster a config is sized for, which ``xtrain plan`` uses when no flag says otherwise.
    ``xtrain train`` ignores it (a run's size is the processes it is started with)."""

    gpus: int | None = Field(default=None, gt=0)
    """Devices of the whole job."""
    gpus_per_node: int | None = Field(default=None, gt=0)
    device: str | None = None
    """One of h100, h200, h800, a100, b200, cpu (``xtrain plan --device``)."""
    model_size: str | None = None
    """A named size (``xtrain info --model``) with the shapes of ``model.hf_path``, for planning where that folder
    is not on this machine; the folder's config.json wins when it is."""


class TrainConfig(_Section):
    """A whole training run: the sections of CONFIG.toml."""

    model: ModelSection
    data: DataConfig
    train: TrainSection
    optim: OptimSection = OptimSection()
    loss: LossSection = LossSection()
    parallel: ParallelSection = ParallelSection()
    memory: MemorySection = MemorySection()
    trace: TraceSection = TraceSection()
    checkpoint: CheckpointSection = CheckpointSection()
    eval: EvalSection = EvalSection()
    track: TrackSection = TrackSection()
    plan: PlanSection = PlanSection()


# Keys holding paths, as (section, key); data.sources[*].path is handled beside them.
_PATH_KEYS = (("model", "hf_path"), ("data", "tokenizer"), ("data", "cache_dir"))


def load_train_config(path: Path, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Read, override, resolve and validate CONFIG.toml; raises ConfigError naming the file and key."""
    raw = _read_toml(path)
    _resolve_paths(raw, path.resolve().parent)
    for override in overrides:
        _apply_override(raw, override, path)
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(_describe(error, path)) from None


def missing_paths(config: TrainConfig) -> list[str]:
    """The files and folders the config names that do not exist (checked before any process starts)."""
    problems = []
    if config.model.hf_path is not None and not (config.model.hf_path / "config.json").is_file():
        problems.append(f"model.hf_path: {config.model.hf_path} holds no config.json")
    for index, source in enumerate(config.data.sources):
        if not source.path.exists():
            problems.append(f"data.sources[{index}].path: {source.path} does not exist")
    for index, source in enumerate(config.eval.sources):
        if not source.path.exists():
            problems.append(f"eval.sources[{index}].path: {source.path} does not exist")
    if not (config.data.tokenizer / "tokenizer.json").is_file():
        problems.append(f"data.tokenizer: {config.data.tokenizer} holds no tokenizer.json")
    return problems


def to_toml(config: TrainConfig) -> str:
    """The resolved configuration as TOML text (every key, defaults included), readable by load_train_config."""
    data = config.model_dump(mode="json", exclude_none=True, by_alias=True)
    lines = ["# Resolved configuration of this run, written by xtrain train (every default filled in)."]
    for section, values in data.items():
        tables = {key: value for key, value in values.items() if _is_table_list(value)}
        lines.append(f"\n[{section}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in values.items() if key not in tables]
        for key, entries in tables.items():
            for entry in entries:
                lines.append(f"\n[[{section}.{key}]]")
                lines += [f"{k} = {_toml_value(v)}" for k, v in entry.items()]
    return "\n".join(lines) + "\n"


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"config file {path} cannot be read: {error}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None


def _resolve_paths(raw: dict[str, Any], base: Path) -> None:
    for section, key in _PATH_KEYS:
        values = raw.get(section)
        if isinstance(values, dict) and isinstance(values.get(key), str):
            values[key] = str(_absolute(values[key], base))
    for section in ("data", "eval"):
        values = raw.get(section)
        if isinstance(values, dict) and isinstance(values.get("sources"), list):
            for source in values["sources"]:
                if isinstance(source, dict) and isinstance(source.get("path"), str):
                    source["path"] = str(_absolute(source["path"], base))


def _absolute(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path


def _apply_override(raw: dict[str, Any], override: str, config_path: Path) -> None:
    key, sep, text = override.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) < 2 or not all(parts):
        raise ConfigError(f"--set {override!r}: expected section.key=value, e.g. --set train.max_steps=10")
    try:
        value: Any = tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        value = text  # a bare word: take it as a string, as a shell user would expect
    target = raw
    for part in parts[:-1]:
        nested = target.setdefault(part, {})
        if not isinstance(nested, dict):
            raise ConfigError(f"--set {override!r}: {part!r} is not a section in {config_path}")
        target = nested
    if (parts[0], parts[-1]) in _PATH_KEYS and len(parts) == 2 and isinstance(value, str):
        value = str(_absolute(value, Path.cwd()))
    target[parts[-1]] = value


def _describe(error: ValidationError, path: Path) -> str:
    # A misspelt key also leaves the key it meant missing: name the misspelling, whose message says the fix.
    errors = sorted(error.errors(), key=lambda e: e["type"] != "extra_forbidden")
    first = errors[0]
    location = [part for part in first["loc"] if not isinstance(part, str) or not part.startswith("function-")]
    dotted = _dotted(location)
    if first["type"] == "extra_forbidden":
        valid = _valid_keys(TrainConfig, location[:-1])
        close = difflib.get_close_matches(str(location[-1]), valid, n=1)
        hint = f"; did you mean {_dotted([*location[:-1], close[0]])!r}?" if close else f"; valid keys: {valid}"
        return f"{path}: unknown key {dotted!r}{hint}"
    if first["type"] == "missing":
        return f"{path}: missing key {dotted!r}"
    message = str(first["msg"]).removeprefix("Value error, ")
    if not dotted:
        return f"{path}: {message}"
    given = first.get("input")
    shown = "" if isinstance(given, dict) else f" (got {given!r})"
    return f"{path}: {dotted}: {message}{shown}"


def _dotted(location: list[Any]) -> str:
    text = ""
    for part in location:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _valid_keys(model: type[BaseModel], location: list[Any]) -> list[str]:
    """Field names of the section at ``location`` (walking nested models and lists of models)."""
    current: Any = model
    for part in location:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part) if isinstance(current, type) and issubclass(current, BaseModel) else None
        if field is None:
            return []
        current = _model_inside(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [info.alias or name for name, info in current.model_fields.items()]  # as spelt in TOML
    return []


def _model_inside(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in get_args(annotation) if get_origin(annotation) is not None else ():
        inner = _model_inside(argument)
        if inner is not None:
            return inner
    return None


def _is_table_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")
