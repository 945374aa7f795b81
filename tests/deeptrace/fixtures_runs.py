"""Builders of synthetic run directories with known answers, written through the real RunWriter and Collector.

Anyone's tests may use them:

- `build_clean_run(run_dir)`: every rank traced a few steps and closed normally; no hang.
- `build_planted_hang(run_dir)`: ranks 0, 1 and 3 entered all_reduce seq 42 of group "dp" in step 7 and stay
  there; rank 2 is stuck in step 7's compute ("forward") and never entered it. Their heartbeats say they made no
  progress for `stuck_for_s` (10 min) before the last rewrite. Judged at the build time, they are alive and
  stalled; judged later (`PlantedHang.judge_at`), their processes are gone after having hung.
- `age_heartbeats(run_dir, seconds)`: move heartbeats' progress times back, as if the processes had lived on,
  blocked, for that long (the daemon thread rewriting the file while the training thread made no progress).

The spans are timed for real (the builders run the loops), so durations are tiny; what is known exactly is the
structure: names, categories, steps, layers, groups and sequence numbers, and the per-rank counts in the result.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from deeptrace.collect import Collector
from deeptrace.rundir import CollectiveMark, RankStepRecord, RunWriter, StepRecord, layout, read_heartbeats
from deeptrace.rundir.jsonio import dumps, write_atomically
from deeptrace.spans import Category

LAYERS = 2
DP_COLLECTIVES_PER_STEP = 2 + 2 * LAYERS  # see _one_step


@dataclass(frozen=True)
class BuiltRun:
    run_dir: Path
    world_size: int
    steps: int
    spans_per_rank: int  # spans in each rank's trace, the step windows included
    dp_collectives_per_rank: int


def age_heartbeats(run_dir: Path, seconds: float, ranks: list[int] | None = None) -> None:
    """Shift the progress times (last event, open span, collectives) of running ranks' heartbeats `seconds` into
    the past, leaving the time the file was written: the rank was alive but blocked for `seconds`."""
    for rank, beat in read_heartbeats(run_dir).items():
        if beat.state != "running" or (ranks is not None and rank not in ranks):
            continue

        def back(mark: CollectiveMark | None) -> CollectiveMark | None:
            return None if mark is None else replace(mark, wall_s=mark.wall_s - seconds)

        span = beat.open_span
        aged = replace(
            beat,
            last_event_wall_s=beat.last_event_wall_s - seconds,
            open_span=None if span is None else replace(span, since_wall_s=span.since_wall_s - seconds),
            collective_entered=back(beat.collective_entered),
            collective_left=back(beat.collective_left),
        )
        write_atomically(layout.heartbeat_path(run_dir, rank), dumps(aged.to_dict(), indent=True))


@dataclass(frozen=True)
class PlantedHang:
    run_dir: Path
    world_size: int
    stuck_rank: int
    hang_step: int
    group: str
    seq: int
    collective: str
    finished_wall_s: float  # when the heartbeats were last written (the processes "died" then)
    stuck_for_s: float  # how long the ranks were alive without progress before that

    def judge_at(self, stall_after_s: float) -> float:
        """A `now_wall` at which every heartbeat is older than `stall_after_s` (the processes are gone)."""
        return self.finished_wall_s + stall_after_s + 1.0


def _write_run_files(run_dir: Path, world_size: int) -> list[RunWriter]:
    writers = [RunWriter(run_dir, rank, world_size) for rank in range(world_size)]
    writers[0].write_meta(
        run_id="synthetic",
        rank_hosts={rank: f"node{rank // 2}" for rank in range(world_size)},
        versions={"fixture": "1"},
        model_flops_per_token=6.0e9,
        device_peak_flops=989e12,
    )
    writers[0].write_config_toml('[run]\nname = "synthetic"\n')
    return writers


def _one_step(collector: Collector, step: int, *, stop_in_forward: bool = False, stop_in_loss: bool = False) -> int:
    """One MoE-like training step; returns the spans it recorded (the step window included).

    forward per layer: compute, then the expert all_to_all dispatch and combine (group "ep");
    loss all_reduce (group "dp"); backward per layer: compute, then a reduce_scatter of gradients (dp);
    gradient-norm all_reduce (dp); optimizer; all_gather of each layer's parameters for the next step (dp).
    That is DP_COLLECTIVES_PER_STEP = 6 dp collectives per step, the first being the loss all_reduce.

    `stop_in_forward` freezes the rank inside the first forward compute, `stop_in_loss` inside the loss
    all_reduce, as a hang would: the collector is closed the way a killed process leaves it.
    """
    spans = 0
    collector.step_begin(step)
    for layer in range(LAYERS):
        with collector.span("forward", Category.COMPUTE, layer=layer):
            if stop_in_forward:
                collector.close(final_state="running")
                return spans
            time.sleep(0.0002)
        for name in ("all_to_all_dispatch", "all_to_all_combine"):
            with collector.collective(name, group="ep", nbytes=1 << 16):
                pass
        spans += 3
    with collector.collective("all_reduce", group="dp", nbytes=4):
        if stop_in_loss:
            collector.close(final_state="running")
            return spans
    spans += 1
    for layer in reversed(range(LAYERS)):
        with collector.span("backward", Category.COMPUTE, layer=layer):
            time.sleep(0.0002)
        with collector.collective("reduce_scatter", group="dp", nbytes=1 << 20):
            pass
        spans += 2
    with collector.collective("all_reduce", group="dp", nbytes=4):
        pass
    with collector.span("optimizer", Category.OPTIMIZER):
        pass
    for _layer in range(LAYERS):
        with collector.collective("all_gather", group="dp", nbytes=1 << 20):
            pass
    spans += 2 + LAYERS
    collector.step_end(step)
    return spans + 1


def build_clean_run(run_dir: Path, *, world_size: int = 4, steps: int = 3) -> BuiltRun:
    writers = _write_run_files(run_dir, world_size)
    spans = 0
    for rank in range(world_size):
        with Collector(run_dir, rank, world_size, heartbeat_interval_s=None) as collector:
            spans = sum(_one_step(collector, step) for step in range(steps))
        for step in range(steps):
            writers[rank].append_rank_step(
                RankStepRecord(step=step, rank=rank, step_time_s=0.01, data_wait_s=0.0, mem_allocated_bytes=1 << 20)
            )
    for step in range(steps):
        writers[0].append_step(StepRecord(step=step, loss=2.0 - 0.1 * step, lr=1e-4, tokens=4096))
    for writer in writers:
        writer.close()
    return BuiltRun(run_dir, world_size, steps, spans, steps * DP_COLLECTIVES_PER_STEP)


def build_planted_hang(
    run_dir: Path, *, world_size: int = 4, stuck_rank: int = 2, hang_step: int = 7, stuck_for_s: float = 600.0
) -> PlantedHang:
    """Ranks other than `stuck_rank` stop inside step `hang_step`'s loss all_reduce, the step's first collective
    of group "dp" (seq 42 with the defaults); `stuck_rank` stops inside that step's first forward compute, so its
    last dp sequence number is the previous step's last (41)."""
    writers = _write_run_files(run_dir, world_size)
    for rank in range(world_size):
        collector = Collector(run_dir, rank, world_size, heartbeat_interval_s=None)
        for step in range(hang_step):
            _one_step(collector, step)
        if rank == stuck_rank:
            _one_step(collector, hang_step, stop_in_forward=True)
        else:
            _one_step(collector, hang_step, stop_in_loss=True)
    for writer in writers:
        writer.close()
    age_heartbeats(run_dir, stuck_for_s)
    seq = hang_step * DP_COLLECTIVES_PER_STEP
    return PlantedHang(run_dir, world_size, stuck_rank, hang_step, "dp", seq, "all_reduce", time.time(), stuck_for_s)
