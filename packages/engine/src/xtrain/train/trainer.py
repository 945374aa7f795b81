"""One process's share of ``xtrain train``: set up, loop over optimizer steps, write the run directory.

Set-up order (each step applied from outside the model): process group → the parallel layout, checked
(``xtrain.parallel.layout``) → its device meshes → model built on the meta device → expert parallelism
(``parallel.ep_size`` > 1: experts split) → activation checkpointing and offload (optional) → per-layer compile
(optional) → FSDP2 →
parameters allocated and initialised (or loaded from the Hugging Face folder) after sharding → optimizer and
schedule → data (token cache built across ranks, packs).

Every rank takes the same global batch of packs from the data stream and runs its slice of it
(``global_batch / world_size`` packs, one micro-batch at a time), so the data order does not depend on the number
of processes. Rank 0 writes the run-wide files (config.toml, meta.json, metrics.jsonl); every rank writes its
per-rank records, log, heartbeat and, when tracing, its deeptrace spans and profiler traces.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from deeptrace.collect import Collector
from deeptrace.rundir import RunWriter, layout
from deeptrace.spans import Category

from xtrain import __version__
from xtrain.config import TrainConfig, to_toml
from xtrain.data import prepare_corpus
from xtrain.errors import TrainingStoppedError
from xtrain.model.flops import training_flops_per_token
from xtrain.model.transformer import Transformer
from xtrain.parallel.distributed import Distributed, barrier, close_distributed, init_distributed
from xtrain.parallel.expert_parallel import received_rows
from xtrain.parallel.layout import ParallelLayout
from xtrain.train.build import build_model, compute_dtype, loss_settings, pack_stream, resolve_model_config
from xtrain.train.checkpoint.locate import ResumePoint
from xtrain.train.checkpoint.parts import (
    CountersPart,
    DataPart,
    ModelPart,
    OptimizerPart,
    RngPart,
    SchedulePart,
    TrainingParts,
)
from xtrain.train.checkpoint.resume import decide_on_all_ranks, restore
from xtrain.train.checkpoint.saver import Checkpointer, RunIdentity
from xtrain.train.evaluate import EvalResult, Evaluator, eval_packs
from xtrain.train.launch import check_world_size
from xtrain.train.logs import setup_logging
from xtrain.train.measure import StepMeasure, measure_step
from xtrain.train.metrics import device_peak_flops, memory_figures
from xtrain.train.optimizer import build_optimizer
from xtrain.train.profiler import kineto_profiler, profiled_steps
from xtrain.train.progress import ProgressLine
from xtrain.train.reporting import Resumed, RunFigures, StepFacts, StepReporter
from xtrain.train.sample_record import SampleRecord, append_samples
from xtrain.train.sampling import Sampler
from xtrain.train.schedule import build_scheduler
from xtrain.train.step import GlobalBatch, MicroBatch, StepResult, train_step
from xtrain.train.tracking import open_trackers

log = logging.getLogger("xtrain")

Finished = TypeVar("Finished")


def train(
    config: TrainConfig,
    run_dir: Path,
    *,
    resume: str = "auto",
    finish: Callable[[Transformer], Finished] | None = None,
    config_name: str | None = None,
) -> Finished | None:
    """Run the whole training job in this process (one rank of it).

    ``resume``: ``auto`` (the newest complete checkpoint of ``run_dir``, else step 0), a checkpoint path, or
    ``none`` (step 0, in a run directory that holds no run). ``finish``, when given, is called on every rank
    with the trained (sharded) model while the process group is still up (it may run collectives, e.g. gather
    the full weights); its result is returned."""
    dist_ctx = init_distributed()
    try:
        model = _train(config, run_dir, dist_ctx, resume, config_name or run_dir.name)
        return finish(model) if finish is not None else None
    finally:
        close_distributed()


def _train(config: TrainConfig, run_dir: Path, dist_ctx: Distributed, resume: str, config_name: str) -> Transformer:
    world = dist_ctx.world_size
    parallel_layout = check_world_size(config, world, dist_ctx.local_world_size)
    # Which checkpoint, checked against the model, before any file is written (a bad one overwrites nothing).
    decision = decide_on_all_ranks(resume, run_dir, resolve_model_config(config), dist_ctx.rank)
    writer = RunWriter(run_dir, dist_ctx.rank, world)
    setup_logging(run_dir, dist_ctx.rank)
    for warning in decision.warnings:
        log.warning("%s", warning)
    collector = Collector(run_dir, dist_ctx.rank, world, trace=config.trace.enabled)
    try:
        trainer = Trainer(
            config, run_dir, dist_ctx, writer, collector, parallel_layout=parallel_layout, config_name=config_name
        )
        model = trainer.run(resume_from=decision.point)
    except BaseException as error:
        collector.close("crashed", error=f"{type(error).__name__}: {error}")
        raise
    else:
        collector.close()
    finally:
        writer.close()
    return model


class Trainer:
    """One rank of a run: its parts built once from the config, then the loop over optimizer steps.

    The parts that a checkpoint holds (model, optimizer, schedule, data position, counters, RNG) are DCP
    ``Stateful`` objects (:mod:`.checkpoint.parts`), registered once with the checkpointer; the loop changes
    them, the checkpointer asks them for their state, a resume loads it back into them."""

    def __init__(
        self,
        config: TrainConfig,
        run_dir: Path,
        dist_ctx: Distributed,
        writer: RunWriter,
        collector: Collector,
        *,
        parallel_layout: ParallelLayout,
        config_name: str | None = None,
    ) -> None:
        self.started = time.perf_counter()
        self.config_name = config_name or run_dir.name
        """What trackers name the experiment after (the config file's name under ``xtrain train``)."""
        self.config, self.run_dir, self.dist, self.writer, self.collector = config, run_dir, dist_ctx, writer, collector
        self.model_cfg = resolve_model_config(config)
        torch.manual_seed(config.train.seed)
        self.layout = parallel_layout
        self.model = build_model(config, self.model_cfg, dist_ctx, parallel_layout, collector)
        self.dtype = compute_dtype(config, dist_ctx.device)
        self.settings = loss_settings(config, self.model_cfg, self.dtype, dist_ctx.device)
        optimizer = build_optimizer(self.model, config.optim, dist_ctx.device)
        self.scheduler = build_scheduler(optimizer, config.optim, config.train.max_steps)
        # Tokenising a large corpus takes long with no step or collective ending: announced, so watchers wait.
        with collector.phase("data_prep"):
            self.corpus = prepare_corpus(
                config.data, rank=dist_ctx.rank, world_size=dist_ctx.world_size, barrier=barrier, log=log.info
            )
        self.stream = pack_stream(config, self.corpus, dist_ctx.world_size)
        self.evaluator = self._evaluator()
        self.sampler = Sampler(config, dist_ctx.device) if config.eval.sample_prompts else None
        self.parts = TrainingParts(
            model=ModelPart(self.model),
            optimizer=OptimizerPart(self.model, optimizer),
            rng=RngPart(dist_ctx.rank, dist_ctx.device),
            schedule=SchedulePart(self.scheduler),
            data=DataPart(self.stream),
            counters=CountersPart(),
        )
        self.config_toml = to_toml(config)
        identity = RunIdentity(
            world_size=dist_ctx.world_size,
            replicate=parallel_layout.replicate,
            config_toml=self.config_toml,
            model_config=self.model_cfg.model_dump(mode="json"),
        )
        self.checkpointer = Checkpointer(config.checkpoint, run_dir, self.parts, identity, collector)
        self.peak_flops = device_peak_flops(dist_ctx.device, self.dtype)

    def run(self, *, resume_from: ResumePoint | None) -> Transformer:
        """Resume (or start), write the run's meta, train to ``train.max_steps``; the trained (sharded) model."""
        start_step, resumed = self._resume(resume_from)
        if self.dist.is_main:
            self._write_meta(start_step)
        self._log_ready()
        max_steps = self.config.train.max_steps
        if start_step >= max_steps:
            log.info("nothing to train: the checkpoint is at step %d of %d", start_step, max_steps)
        progress = ProgressLine(max_steps, enabled=self.dist.is_main)
        figures = RunFigures(
            self.model_cfg, self.dist.world_size, max_steps, start_step, self.peak_flops, self.dist.is_main
        )
        train_started = time.perf_counter()
        with progress, kineto_profiler(self.config, self.run_dir, self.dist) as profiler:
            trackers = None
            if self.dist.is_main:
                trackers = open_trackers(self.config, self.run_dir, config_name=self.config_name, start_step=start_step)
            reporter = StepReporter(self.writer, figures, progress, trackers)
            try:
                for step in range(start_step + 1, max_steps + 1):
                    facts = self._step(step, train_started, resumed if step == start_step + 1 else None)
                    if profiler is not None:
                        profiler.step()
                    reporter.submit(facts)
                    self._check_skips(facts)
            finally:
                reporter.close()
        self.checkpointer.close()
        log.info("trained steps %d to %d in %.1f s", start_step + 1, max_steps, time.perf_counter() - train_started)
        return self.model

    def _step(self, step: int, train_started: float, resumed: Resumed | None) -> StepFacts:
        """One optimizer step, its checkpoint when one is due, and what was measured of it."""
        collector, world = self.collector, self.dist.world_size
        collector.step_begin(step)
        step_started = time.perf_counter()
        with collector.span("data", Category.DATA):
            packs = self.stream.next_packs(self.config.train.global_batch)
            per_rank = len(packs) // world
            mine = packs[self.dist.rank * per_rank : (self.dist.rank + 1) * per_rank]
            micro_batches = [MicroBatch.from_pack(pack, self.dist.device) for pack in mine]
        data_wait = time.perf_counter() - step_started
        lr = float(self.scheduler.get_last_lr()[0])  # a Python float: LambdaLR computes it on the host
        result, measured = self._train_step(step, micro_batches, GlobalBatch.of(packs))
        self.scheduler.step()
        self.parts.counters.record_step(result.skipped)
        step_time = time.perf_counter() - step_started
        stall = None
        self.checkpointer.poll()
        if self.checkpointer.due(step, self.config.train.max_steps):
            stall = self.checkpointer.save(step)
        evaluated = self._evaluate(step)
        collector.step_end(step)
        counters = self.parts.counters.counters
        return StepFacts(
            step=step,
            result=result,
            lr=lr,
            packs=packs,
            mine=mine,
            step_time_s=step_time,
            data_wait_s=data_wait,
            wall_s=time.perf_counter() - self.started,
            train_elapsed_s=time.perf_counter() - train_started,
            skipped_lines=self.corpus.skipped_lines,
            skipped_steps=counters.skipped_steps,
            memory=memory_figures(self.dist.device),
            checkpoint_stall_s=stall,
            eval_loss=None if evaluated is None else evaluated.loss,
            resumed=resumed,
            measured=measured,
        )

    def _train_step(
        self, step: int, micro_batches: list[MicroBatch], global_batch: GlobalBatch
    ) -> tuple[StepResult, StepMeasure | None]:
        """The optimizer step; with ``trace.memory``, measured (its tensor peak and the bytes it sent)."""

        def run() -> StepResult:
            return train_step(
                self.model,
                self.parts.optimizer.optimizer,
                micro_batches,
                global_batch,
                self.settings,
                dp_size=self.dist.world_size,
                collector=self.collector,
            )

        if not self.config.trace.memory:
            return run(), None
        return measure_step(
            run,
            self.dist.device,
            self.layout.processes_per_node,
            log_path=layout.log_path(self.run_dir, self.dist.rank),
            profiler_running=step in profiled_steps(self.config),
            expert_rows=lambda: received_rows(self.model),
        )

    def _evaluator(self) -> Evaluator | None:
        """The held-out evaluation of ``[eval]``, its packs made once (None without ``eval.sources``)."""
        if not self.config.eval.enabled:
            return None
        with self.collector.phase("data_prep"):
            packs = eval_packs(self.config, self.dist, barrier, log.info)
        return Evaluator(self.config, packs, self.settings, self.dist)

    def _evaluate(self, step: int) -> EvalResult | None:
        """The held-out loss when ``step`` is one that evaluates (an announced phase: watchers wait for it)."""
        if self.evaluator is None or not self.evaluator.due(step):
            return None
        with self.collector.phase("eval"):
            result = self.evaluator.evaluate(self.model)
            samples = None if self.sampler is None else self.sampler.sample(self.model)
        log.info("step %d: eval loss %.4f (perplexity %.2f)", step, result.loss, result.ppl)
        if samples is not None and self.dist.is_main:
            append_samples(self.run_dir, SampleRecord(step=step, samples=samples))
        return result

    def _check_skips(self, facts: StepFacts) -> None:
        """A step that was not finite is said; too many in a row stop the run."""
        result, limit = facts.result, self.config.train.max_skipped_steps_in_a_row
        if result.skipped:
            log.warning(
                "step %d skipped: loss %s, gradient norm %s (not finite)", facts.step, result.loss, result.grad_norm
            )
        in_a_row = self.parts.counters.counters.skipped_in_a_row
        if in_a_row >= limit:
            raise TrainingStoppedError(
                f"stopped at step {facts.step}: {in_a_row} steps in a row had a loss or gradient that is not "
                f"finite (train.max_skipped_steps_in_a_row = {limit}); lower optim.lr or check the data"
            )

    def _resume(self, point: ResumePoint | None) -> tuple[int, Resumed | None]:
        """The step to start from, and what the first record says about where the run came from."""
        if point is None:
            # --resume auto over a run that never completed a checkpoint starts over, and says so.
            restarted = layout.metrics_path(self.run_dir).exists()
            return 0, (Resumed(from_step=0) if restarted else None)
        restore(point, self.parts)
        log.info(
            "resumed from %s at step %d (saved by %d processes, now %d)",
            point.folder,
            point.step,
            point.manifest.world_size,
            self.dist.world_size,
        )
        return point.step, Resumed(point.step, str(point.folder), point.manifest.world_size)

    def _write_meta(self, start_step: int) -> None:
        config, dist_ctx = self.config, self.dist
        self.writer.write_config_toml(self.config_toml)
        self.writer.write_meta(
            versions={"torch": torch.__version__, "xtrain": __version__},
            model_flops_per_token=training_flops_per_token(self.model_cfg, [config.data.pack_tokens]),
            device_peak_flops=self.peak_flops,
            extras={
                "model": config.model.size or str(config.model.hf_path),
                "attention_backend": self.model.attention_backend,
                "compute_dtype": str(self.dtype).removeprefix("torch."),
                "device": str(dist_ctx.device),
                "max_steps": config.train.max_steps,
                "global_batch": config.train.global_batch,
                "pack_tokens": config.data.pack_tokens,
                "start_step": start_step,
            },
        )

    def _log_ready(self) -> None:
        log.info(
            "rank %d/%d on %s: model %s, %s, chunk %d tokens, set up in %.1f s",
            self.dist.rank,
            self.dist.world_size,
            self.dist.device,
            self.config.model.size or self.config.model.hf_path,
            self.dtype,
            self.settings.chunk_tokens,
            time.perf_counter() - self.started,
        )
