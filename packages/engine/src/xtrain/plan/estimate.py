"""The step-time estimate: a roofline of compute, communication and host transfers, with an overlap model.

Each term is time at a named rate of the device (:mod:`xtrain.plan.devices`, cited in docs/plan.md):

- compute: the step's FLOPs on this rank (the model's, as `xtrain info` counts them, plus the forward recomputed
  for checkpointed layers) at ``peak × matmul_efficiency``;
- a collective: the bytes this rank sends (:mod:`xtrain.plan.comm`), inside the node at ``intra_bytes_per_s``
  and off it at ``inter_bytes_per_s``, both times ``link_efficiency``;
- offload: the checkpoints to the host and back at ``host_bytes_per_s``;
- the optimizer step: AdamW reads and writes the rank's shards (about 36 B per element) at the memory bandwidth.

What hides behind what:

- FSDP's all-gathers and reduce-scatters, and HSDP's all-reduce, are issued one layer ahead (prefetch) or
  right after a layer's backward, and run while other layers compute: they are exposed only where they exceed
  the compute, plus the first layer's gather, which nothing precedes. Without prefetch they are all exposed.
- The all-to-all of expert parallelism is on the MoE layer's critical path: exposed in full with one slice;
  with Domino slices (``parallel.domino_slices`` = s > 1) one slice's exchange overlaps another's expert
  compute, leaving 1/s of it exposed plus whatever exceeds the experts' compute.
- Offload's copies run on their own stream while the layers compute: exposed only beyond the compute.
- The optimizer step follows the last reduce-scatter: never hidden.

Collectives of different kinds are assumed not to slow each other down (they do share links): a lower bound on
the communication time, so the estimate leans optimistic where communication dominates (docs/plan.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from xtrain.plan.comm import LinkBytes
from xtrain.plan.devices import Device

OPTIMIZER_BYTES_PER_ELEMENT = 36  # AdamW: read param, grad, 2 moments (4 B each), write param and 2 moments


@dataclass(frozen=True)
class StepWork:
    """What one rank does in one optimizer step."""

    model_flops: float
    """The model's training FLOPs on this rank (no recompute)."""
    recompute_flops: float
    expert_flops: float
    """Of ``model_flops``: the routed experts' share (what Domino overlaps the all-to-all with)."""
    comm: dict[str, LinkBytes]
    offload_bytes: int
    shard_numel: int
    layers: int


@dataclass(frozen=True)
class StepEstimate:
    step_time_s: float
    compute_s: float
    exposed_s: dict[str, float]
    """Exposed time by source: fsdp (all-gather, reduce-scatter, all-reduce), all_to_all, offload, optimizer."""
    bottleneck: str


def estimate_step(work: StepWork, device: Device, *, bf16: bool, prefetch: bool, domino_slices: int) -> StepEstimate:
    rate = device.peak_flops(bf16) * device.matmul_efficiency
    compute = (work.model_flops + work.recompute_flops) / rate
    link = {kind: _link_time(bytes_, device) for kind, bytes_ in work.comm.items()}
    fsdp = link.get("all_gather", 0.0) + link.get("reduce_scatter", 0.0) + link.get("all_reduce", 0.0)
    if prefetch:
        first_gather = link.get("all_gather", 0.0) / max(work.layers, 1)
        fsdp_exposed = max(0.0, fsdp - compute) + first_gather
    else:
        fsdp_exposed = fsdp
    a2a = link.get("all_to_all", 0.0)
    if domino_slices > 1:
        hidden_behind = work.expert_flops / rate
        a2a_exposed = a2a / domino_slices + max(0.0, a2a * (domino_slices - 1) / domino_slices - hidden_behind)
    else:
        a2a_exposed = a2a
    offload = max(0.0, work.offload_bytes / device.host_bytes_per_s - compute)
    optimizer = OPTIMIZER_BYTES_PER_ELEMENT * work.shard_numel / device.memory_bytes_per_s
    exposed = {"fsdp": fsdp_exposed, "all_to_all": a2a_exposed, "offload": offload, "optimizer": optimizer}
    terms = {"compute": compute, **exposed}
    return StepEstimate(compute + sum(exposed.values()), compute, exposed, max(terms, key=terms.__getitem__))


def _link_time(sent: LinkBytes, device: Device) -> float:
    efficiency = device.link_efficiency
    return sent.intra / (device.intra_bytes_per_s * efficiency) + sent.inter / (device.inter_bytes_per_s * efficiency)
