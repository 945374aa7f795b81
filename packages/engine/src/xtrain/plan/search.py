"""`xtrain plan --search`: every valid combination of the settings that shape a run, the ones that fit, ranked
by estimated tokens/s.

The settings varied: ``parallel.replicate`` (the divisors of the node count: replicas across nodes),
``parallel.ep_size`` (the divisors of the GPUs per node that divide the experts), ``parallel.domino_slices`` (1,
and 2 under expert parallelism), ``memory.checkpointing`` (none, full) with ``memory.offload`` (only with
checkpointing), ``data.pack_tokens`` (4k to 64k) and the packs per rank per step (1, 2, 4, 8: ``train.global_batch``
is that times the GPUs). Each combination is validated by the layout check training uses; those it refuses are
not candidates.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from xtrain.config import TrainConfig
from xtrain.errors import ConfigError
from xtrain.model.config import ModelConfig
from xtrain.parallel.layout import check_layout
from xtrain.plan.planner import Cluster, Plan, plan_for

PACK_TOKENS = (4096, 8192, 16384, 32768, 65536)
PACKS_PER_RANK = (1, 2, 4, 8)


@dataclass(frozen=True)
class Candidate:
    config: TrainConfig
    plan: Plan


def search(config: TrainConfig, model: ModelConfig, cluster: Cluster) -> list[Candidate]:
    """The combinations that fit, best estimated tokens/s first (ConfigError when none fits)."""
    found = [Candidate(c, p) for c in candidates(config, model, cluster) if (p := _plan(c, model, cluster)).fits]
    if not found:
        raise ConfigError(
            f"no combination fits {cluster.gpus} x {cluster.device.name}: the model needs more devices, or "
            "devices with more memory"
        )
    return sorted(found, key=lambda candidate: -candidate.plan.tokens_per_s)


def candidates(config: TrainConfig, model: ModelConfig, cluster: Cluster) -> list[TrainConfig]:
    nodes = cluster.gpus // cluster.gpus_per_node
    experts = model.moe.num_experts if model.moe is not None else None
    replicas = [r for r in range(1, nodes + 1) if nodes % r == 0]
    eps = [e for e in range(1, cluster.gpus_per_node + 1) if cluster.gpus_per_node % e == 0]
    eps = [e for e in eps if e == 1 or (experts is not None and experts % e == 0)]
    memory = [("none", False), ("full", False), ("full", True)]
    found = []
    for replicate, ep, (checkpointing, offload), tokens, packs in itertools.product(
        replicas, eps, memory, PACK_TOKENS, PACKS_PER_RANK
    ):
        for slices in (1, 2) if ep > 1 else (1,):
            candidate = _with(config, replicate, ep, slices, checkpointing, offload, tokens, packs * cluster.gpus)
            try:
                check_layout(candidate.parallel, cluster.gpus, cluster.gpus_per_node, experts)
            except ConfigError:
                continue
            found.append(candidate)
    return found


def _with(  # noqa: PLR0917 (one argument per searched setting)
    config: TrainConfig,
    replicate: int,
    ep: int,
    slices: int,
    checkpointing: str,
    offload: bool,
    tokens: int,
    global_batch: int,
) -> TrainConfig:
    raw = config.model_dump(by_alias=True)
    raw["parallel"].update(replicate=replicate, ep_size=ep, domino_slices=slices)
    raw["memory"].update(checkpointing=checkpointing, offload=offload)
    raw["data"]["pack_tokens"] = tokens
    raw["train"]["global_batch"] = global_batch
    return TrainConfig.model_validate(raw)


def _plan(config: TrainConfig, model: ModelConfig, cluster: Cluster) -> Plan:
    experts = model.moe.num_experts if model.moe is not None else None
    layout = check_layout(config.parallel, cluster.gpus, cluster.gpus_per_node, experts)
    return plan_for(config, model, layout, cluster.device)
