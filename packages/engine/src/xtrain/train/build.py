"""The pieces of a run built from its config: the model's shapes and dtype, the sharded model, the pack stream and
the loss settings. Each parallel technique is applied from outside the model, one ``apply_*`` step each."""

from __future__ import annotations

import torch
from deeptrace.collect import Collector

from xtrain.config import TrainConfig
from xtrain.data import Corpus, PackStream
from xtrain.data.packing import Balance
from xtrain.loss import auto_chunk_tokens
from xtrain.model.config import ModelConfig
from xtrain.model.hf import read_hf_config
from xtrain.model.sizes import model_config
from xtrain.model.transformer import Transformer
from xtrain.parallel.checkpointing import apply_activation_checkpointing
from xtrain.parallel.compile import apply_compile
from xtrain.parallel.distributed import Distributed
from xtrain.parallel.expert_parallel import ExchangeSpans, apply_expert_parallel
from xtrain.parallel.fsdp import apply_fsdp
from xtrain.parallel.layout import ParallelLayout
from xtrain.parallel.materialize import materialize
from xtrain.parallel.mesh import model_meshes
from xtrain.parallel.offload import apply_activation_offload
from xtrain.train.step import LossSettings


def resolve_model_config(config: TrainConfig) -> ModelConfig:
    """The model's shapes: a named size, or the Hugging Face folder's config.json; with the chosen attention
    backend and experts path."""
    if config.model.hf_path is not None:
        base = read_hf_config(config.model.hf_path)
    else:
        assert config.model.size is not None  # the config validator requires one of the two
        base = model_config(config.model.size)
    update: dict[str, object] = {"attention_backend": config.model.attention_backend}
    if base.moe is not None:
        update["moe"] = base.moe.model_copy(update={"experts_impl": config.model.experts_impl})
    return base.model_copy(update=update)


def compute_dtype(config: TrainConfig, device: torch.device) -> torch.dtype:
    choice = config.parallel.mixed_precision
    if choice == "auto":
        choice = "bf16" if device.type == "cuda" else "fp32"
    return torch.bfloat16 if choice == "bf16" else torch.float32


def build_model(
    config: TrainConfig,
    model_cfg: ModelConfig,
    dist_ctx: Distributed,
    layout: ParallelLayout,
    collector: Collector | None = None,
) -> Transformer:
    """The sharded, materialised model: meta → (expert parallelism) → (checkpointing, offload) → (compile) →
    FSDP2 → allocate + init/load after sharding, over the meshes of ``layout`` (checked by ``check_layout``).
    ``collector``: the all-to-alls of expert parallelism are recorded as its COMM spans."""
    meshes = model_meshes(layout, dist_ctx.device.type)
    with torch.device("meta"):
        model = Transformer(model_cfg)
    if meshes.expert is not None:
        # First: checkpointing then wraps layers whose MoE blocks already exchange tokens (and saves what they
        # receive, see parallel/checkpointing.py), and FSDP shards the expert DTensors over their replicas.
        observer = ExchangeSpans(collector) if collector is not None and config.trace.enabled else None
        apply_expert_parallel(model, meshes.expert, domino_slices=config.parallel.domino_slices, observer=observer)
    apply_activation_checkpointing(model, config.memory.checkpointing)
    if config.memory.offload:
        apply_activation_offload(model, dist_ctx.device, config.memory.offload_resident_layers)
    if config.parallel.compile:
        # Under EP the exchange schedule is kept out of the graph (host-side split sizes): a graph break.
        apply_compile(model, fullgraph=not layout.expert_parallel)
    apply_fsdp(
        model,
        meshes.dense,
        param_dtype=compute_dtype(config, dist_ctx.device),
        reshard_after_forward=config.parallel.reshard_after_forward,
        prefetch=config.parallel.prefetch,
        expert_mesh=meshes.expert_shard,
    )
    materialize(model, dist_ctx.device, seed=config.train.seed, hf_path=config.model.hf_path)
    return model


def pack_stream(config: TrainConfig, corpus: Corpus, world_size: int) -> PackStream:
    """The run's packs; balanced over the ``world_size`` data-parallel ranks when data.balance_window is set."""
    balance = None
    if config.data.balance_window:
        balance = Balance(config.data.balance_window, config.train.global_batch, world_size)
    return PackStream(
        corpus, config.data.pack_tokens, seed=config.train.seed, lookahead=config.data.pack_lookahead, balance=balance
    )


def loss_settings(
    config: TrainConfig, model_cfg: ModelConfig, dtype: torch.dtype, device: torch.device
) -> LossSettings:
    chunk = config.loss.chunk_tokens
    if chunk == "auto":
        chunk = auto_chunk_tokens(model_cfg.vocab_size, dtype, device=device)
    moe = model_cfg.moe
    aux = config.loss.aux_loss_coef if config.loss.aux_loss_coef is not None else (moe.aux_loss_coef if moe else 0.0)
    z = config.loss.z_loss_coef if config.loss.z_loss_coef is not None else (moe.z_loss_coef if moe else 0.0)
    return LossSettings(chunk_tokens=chunk, aux_loss_coef=aux, z_loss_coef=z, max_grad_norm=config.optim.max_grad_norm)
