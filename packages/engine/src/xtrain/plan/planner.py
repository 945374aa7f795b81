"""`xtrain plan`: what a run needs per rank and what it should reach, before it starts.

The plan reads the same typed config as ``xtrain train`` and checks the job with the same function
(``launch.check_world_size``, which builds the :class:`~xtrain.parallel.layout.ParallelLayout`): a config that
training refuses is refused here with the same message. Memory comes from :mod:`xtrain.plan.memory`, bytes on the
links from :mod:`xtrain.plan.comm`, time from :mod:`xtrain.plan.estimate`, FLOPs from :mod:`xtrain.model.flops`
(what ``xtrain info`` and the trainer's MFU count).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from xtrain.config import TrainConfig
from xtrain.errors import ConfigError
from xtrain.model.config import ModelConfig
from xtrain.model.flops import training_flops
from xtrain.parallel.checkpointing import checkpointed_layers
from xtrain.parallel.layout import ParallelLayout
from xtrain.plan.comm import KINDS, LinkBytes, comm_bytes_per_step
from xtrain.plan.devices import Device, device
from xtrain.plan.estimate import StepWork, estimate_step
from xtrain.plan.memory import plan_memory
from xtrain.plan.shapes import fsdp_groups


@dataclass(frozen=True)
class Cluster:
    gpus: int
    gpus_per_node: int
    device: Device


@dataclass(frozen=True)
class Plan:
    fits: bool
    peak_bytes: int
    tensor_peak_bytes: int
    capacity_bytes: int
    parts: dict[str, int]
    host_bytes: int
    flops_per_step: float
    comm_bytes: dict[str, dict[str, int]]
    step_time_s: float
    tokens_per_s: float
    mfu: float
    bottleneck: str
    exposed_s: dict[str, float]
    compute_s: float
    layout: dict[str, int]
    settings: dict[str, Any]
    assumptions: dict[str, Any]

    @property
    def margin_bytes(self) -> int:
        return self.capacity_bytes - self.peak_bytes

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "margin_bytes": self.margin_bytes}


def resolve_cluster(config: TrainConfig, gpus: int | None, gpus_per_node: int | None, name: str | None) -> Cluster:
    """The cluster from the flags, else the config's ``[plan]`` section (ConfigError when neither says)."""
    gpus = gpus if gpus is not None else config.plan.gpus
    per_node = gpus_per_node if gpus_per_node is not None else config.plan.gpus_per_node
    name = name if name is not None else config.plan.device
    if gpus is None:
        raise ConfigError("how many GPUs: pass --gpus N or set plan.gpus in the config")
    if name is None:
        raise ConfigError("which device: pass --device NAME or set plan.device in the config")
    chosen = device(name)
    per_node = per_node if per_node is not None else min(gpus, 8 if chosen.name != "cpu" else gpus)
    if gpus % per_node:
        raise ConfigError(f"--gpus {gpus} does not divide into nodes of {per_node} (--gpus-per-node {per_node})")
    return Cluster(gpus, per_node, chosen)


def planned_model(config: TrainConfig) -> ModelConfig:
    """The model's shapes, as training reads them; ``plan.model_size`` stands in for an ``hf_path`` that is not
    on this machine."""
    from xtrain.model.sizes import model_config  # noqa: PLC0415
    from xtrain.train.build import resolve_model_config  # noqa: PLC0415

    if _stands_in(config) and config.plan.model_size is not None:
        return model_config(config.plan.model_size)
    return resolve_model_config(config)


def _stands_in(config: TrainConfig) -> bool:
    """Whether ``plan.model_size`` stands in for a ``model.hf_path`` that is not on this machine."""
    hf_path = config.model.hf_path
    return hf_path is not None and not (hf_path / "config.json").is_file() and config.plan.model_size is not None


def make_plan(config: TrainConfig, cluster: Cluster) -> Plan:
    from xtrain.train.launch import check_world_size  # noqa: PLC0415

    checked = config
    if _stands_in(config):  # the layout check reads the experts from the model: from the named size here
        named = config.model.model_copy(update={"size": config.plan.model_size, "hf_path": None})
        checked = config.model_copy(update={"model": named})
    layout = check_world_size(checked, cluster.gpus, cluster.gpus_per_node)
    model = planned_model(config)
    return plan_for(config, model, layout, cluster.device)


def plan_for(
    config: TrainConfig,
    model: ModelConfig,
    layout: ParallelLayout,
    dev: Device,
    *,
    expert_rows: Sequence[int] | None = None,
) -> Plan:
    """The plan of ``config``; ``expert_rows``: the rows the planned rank's experts receive per MoE layer under
    expert parallelism, where they are known (a measured run); uniform routing otherwise."""
    bf16 = _bf16(config, dev)
    dt = 2 if bf16 else 4
    tokens = config.data.pack_tokens
    micro = config.train.global_batch // layout.world_size
    groups = fsdp_groups(model, layout, reshard_after_forward=config.parallel.reshard_after_forward)
    memory = plan_memory(
        config,
        model,
        layout,
        groups,
        dt=dt,
        pack_tokens=tokens,
        headroom=dev.allocator_headroom,
        expert_rows=expert_rows,
    )
    comm = comm_bytes_per_step(
        config,
        model,
        layout,
        pack_tokens=tokens,
        micro_batches=micro,
        device_type="cpu" if dev.name == "cpu" else "cuda",
    )
    work = _work(config, model, comm, shard_numel=sum(g.shard_numel for g in groups), micro=micro, dt=dt)
    estimate = estimate_step(
        work, dev, bf16=bf16, prefetch=config.parallel.prefetch, domino_slices=config.parallel.domino_slices
    )
    global_tokens = config.train.global_batch * tokens
    flops_per_step = float(training_flops(model, [tokens]) * config.train.global_batch)
    peak = dev.peak_flops(bf16)
    return Plan(
        fits=memory.peak_bytes <= dev.memory_bytes,
        peak_bytes=memory.peak_bytes,
        tensor_peak_bytes=memory.tensor_peak_bytes,
        capacity_bytes=dev.memory_bytes,
        parts=memory.parts,
        host_bytes=memory.host_bytes,
        flops_per_step=flops_per_step,
        comm_bytes={kind: {"intra": comm[kind].intra, "inter": comm[kind].inter} for kind in KINDS},
        step_time_s=estimate.step_time_s,
        tokens_per_s=global_tokens / estimate.step_time_s,
        mfu=flops_per_step / (estimate.step_time_s * layout.world_size * peak),
        bottleneck=estimate.bottleneck,
        exposed_s=estimate.exposed_s,
        compute_s=estimate.compute_s,
        layout=_layout_figures(layout),
        settings=_settings(config),
        assumptions=_assumptions(dev, bf16),
    )


def _layout_figures(layout: ParallelLayout) -> dict[str, int]:
    return {
        "gpus": layout.world_size,
        "gpus_per_node": layout.processes_per_node,
        "replicate": layout.replicate,
        "shard": layout.shard,
        "ep": layout.ep,
    }


def _bf16(config: TrainConfig, dev: Device) -> bool:
    choice = config.parallel.mixed_precision
    return choice == "bf16" or (choice == "auto" and dev.name != "cpu")


def _work(
    config: TrainConfig, model: ModelConfig, comm: dict[str, LinkBytes], *, shard_numel: int, micro: int, dt: int
) -> StepWork:
    """This rank's share of the step: FLOPs (with the recompute), the experts' share, bytes to move."""
    tokens = config.data.pack_tokens
    per_rank = float(training_flops(model, [tokens]) * micro)
    head = 6.0 * model.vocab_size * model.hidden_size * tokens * micro
    checkpointed = checkpointed_layers(config.memory.checkpointing, model.num_layers)
    recompute = (per_rank - head) / model.num_layers * len(checkpointed) / 3
    expert = 0.0
    if model.moe is not None:
        moe = model.moe
        moe_layers = _moe_layer_count(model)
        expert = 6.0 * moe.num_experts_per_tok * 3 * model.hidden_size * moe.moe_intermediate_size * moe_layers
        expert *= tokens * micro
    offload = 0
    if config.memory.offload:
        offload = 2 * len(checkpointed) * tokens * model.hidden_size * dt * micro
    return StepWork(per_rank, recompute, expert, comm, offload, shard_numel, model.num_layers)


@functools.lru_cache(maxsize=8)
def _moe_layer_count(model: ModelConfig) -> int:
    return sum(model.is_moe_layer(i) for i in range(model.num_layers))


def _settings(config: TrainConfig) -> dict[str, Any]:
    return {
        "replicate": config.parallel.replicate,
        "ep_size": config.parallel.ep_size,
        "domino_slices": config.parallel.domino_slices,
        "checkpointing": config.memory.checkpointing,
        "offload": config.memory.offload,
        "pack_tokens": config.data.pack_tokens,
        "global_batch": config.train.global_batch,
        "mixed_precision": config.parallel.mixed_precision,
    }


def _assumptions(dev: Device, bf16: bool) -> dict[str, Any]:
    return {
        "device": dev.name,
        "compute_dtype": "bf16" if bf16 else "fp32",
        "peak_flops": dev.peak_flops(bf16),
        "matmul_efficiency": dev.matmul_efficiency,
        "intra_node_bytes_per_s": dev.intra_bytes_per_s,
        "inter_node_bytes_per_s": dev.inter_bytes_per_s,
        "link_efficiency": dev.link_efficiency,
        "host_bytes_per_s": dev.host_bytes_per_s,
        "memory_bytes_per_s": dev.memory_bytes_per_s,
        "allocator_headroom": dev.allocator_headroom,
        "documents": "one per pack (attention FLOPs at their upper bound)",
        "routing": "uniform over experts (all-to-all bytes are an expectation)",
        "source": "docs/plan.md",
    }
