"""One process's share of ``xtrain train``: set up, loop over optimizer steps, write the run directory.

Set-up order (each step applied from outside the model): process group → model built on the meta device →
expert parallelism (``parallel.ep_size`` > 1: the fsdp × ep mesh, experts split) → activation checkpointing and
offload (optional) → data-parallel mesh → per-layer compile (optional) → FSDP2 →
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
from typing import Any, TypeVar

import numpy as np
import torch
from deeptrace.collect import Collector
from deeptrace.rundir import RunWriter, layout
from deeptrace.spans import Category

from xtrain import __version__
from xtrain.config import TrainConfig, to_toml
from xtrain.data import prepare_corpus
from xtrain.data.balance import pack_cost
from xtrain.errors import TrainingStoppedError
from xtrain.model.flops import training_flops_per_token
from xtrain.model.transformer import Transformer
from xtrain.parallel.distributed import Distributed, barrier, close_distributed, init_distributed
from xtrain.train.build import build_model, compute_dtype, loss_settings, pack_stream, resolve_model_config
from xtrain.train.checkpoint.locate import ResumePoint
from xtrain.train.checkpoint.resume import decide_on_all_ranks, restore
from xtrain.train.checkpoint.saver import Checkpointer
from xtrain.train.launch import check_world_size
from xtrain.train.logs import setup_logging
from xtrain.train.metrics import device_peak_flops, memory_figures, mfu
from xtrain.train.optimizer import build_optimizer
from xtrain.train.profiler import kineto_profiler
from xtrain.train.progress import ProgressLine
from xtrain.train.schedule import build_scheduler
from xtrain.train.step import GlobalBatch, MicroBatch, train_step

log = logging.getLogger("xtrain")

Finished = TypeVar("Finished")


def train(
    config: TrainConfig,
    run_dir: Path,
    *,
    resume: str = "auto",
    finish: Callable[[Transformer], Finished] | None = None,
) -> Finished | None:
    """Run the whole training job in this process (one rank of it).

    ``resume``: ``auto`` (the newest complete checkpoint of ``run_dir``, else step 0), a checkpoint path, or
    ``none`` (step 0, in a run directory that holds no run). ``finish``, when given, is called on every rank
    with the trained (sharded) model while the process group is still up (it may run collectives, e.g. gather
    the full weights); its result is returned."""
    dist_ctx = init_distributed()
    try:
        model = _train(config, run_dir, dist_ctx, resume)
        return finish(model) if finish is not None else None
    finally:
        close_distributed()


def _train(config: TrainConfig, run_dir: Path, dist_ctx: Distributed, resume: str) -> Transformer:
    world = dist_ctx.world_size
    check_world_size(config, world, dist_ctx.local_world_size)
    # Which checkpoint, checked against the model, before any file is written (a bad one overwrites nothing).
    decision = decide_on_all_ranks(resume, run_dir, resolve_model_config(config), dist_ctx.rank)
    writer = RunWriter(run_dir, dist_ctx.rank, world)
    setup_logging(run_dir, dist_ctx.rank)
    for warning in decision.warnings:
        log.warning("%s", warning)
    collector = Collector(run_dir, dist_ctx.rank, world, trace=config.trace.enabled)
    try:
        model = _run(config, run_dir, dist_ctx, writer, collector, resume_from=decision.point)
    except BaseException as error:
        collector.close("crashed", error=f"{type(error).__name__}: {error}")
        raise
    else:
        collector.close()
    finally:
        writer.close()
    return model


def _run(  # noqa: PLR0915 (one readable sequence: set up, then the loop)
    config: TrainConfig,
    run_dir: Path,
    dist_ctx: Distributed,
    writer: RunWriter,
    collector: Collector,
    *,
    resume_from: ResumePoint | None,
) -> Transformer:
    started = time.perf_counter()
    model_cfg = resolve_model_config(config)
    torch.manual_seed(config.train.seed)
    model = build_model(config, model_cfg, dist_ctx, collector)
    dtype = compute_dtype(config, dist_ctx.device)
    settings = loss_settings(config, model_cfg, dtype, dist_ctx.device)
    optimizer = build_optimizer(model, config.optim, dist_ctx.device)
    scheduler = build_scheduler(optimizer, config.optim, config.train.max_steps)

    # Tokenising a large corpus takes long with no step or collective ending: announced, so watchers wait.
    with collector.phase("data_prep"):
        corpus = prepare_corpus(
            config.data, rank=dist_ctx.rank, world_size=dist_ctx.world_size, barrier=barrier, log=log.info
        )
    stream = pack_stream(config, corpus, dist_ctx.world_size)
    start_step = skipped_total = skipped_in_a_row = 0
    resumed_fields: dict[str, Any] = {}
    if resume_from is not None:
        saved = restore(resume_from, model, optimizer, scheduler, stream, rank=dist_ctx.rank, device=dist_ctx.device)
        start_step = resume_from.step
        skipped_total, skipped_in_a_row = int(saved["skipped_steps"]), int(saved["skipped_in_a_row"])
        resumed_fields = {
            "resumed_from_step": start_step,
            "resumed_from": str(resume_from.folder),
            "resumed_from_world_size": resume_from.manifest.world_size,
        }
        log.info(
            "resumed from %s at step %d (saved by %d processes, now %d)",
            resume_from.folder,
            start_step,
            resume_from.manifest.world_size,
            dist_ctx.world_size,
        )
    elif layout.metrics_path(run_dir).exists():
        # --resume auto over a run that never completed a checkpoint: it starts over, and says so.
        resumed_fields = {"resumed_from_step": 0, "resumed_from": None}
    peak = device_peak_flops(dist_ctx.device, dtype)
    config_toml = to_toml(config)
    if dist_ctx.is_main:
        writer.write_config_toml(config_toml)
        writer.write_meta(
            versions={"torch": torch.__version__, "xtrain": __version__},
            model_flops_per_token=training_flops_per_token(model_cfg, [config.data.pack_tokens]),
            device_peak_flops=peak,
            extras={
                "model": config.model.size or str(config.model.hf_path),
                "attention_backend": model.attention_backend,
                "compute_dtype": str(dtype).removeprefix("torch."),
                "device": str(dist_ctx.device),
                "max_steps": config.train.max_steps,
                "global_batch": config.train.global_batch,
                "pack_tokens": config.data.pack_tokens,
                "start_step": start_step,
            },
        )
    checkpointer = Checkpointer(
        config.checkpoint,
        run_dir,
        rank=dist_ctx.rank,
        world_size=dist_ctx.world_size,
        replicate=config.parallel.replicate,
        device=dist_ctx.device,
        max_steps=config.train.max_steps,
        config_toml=config_toml,
        model_config=model_cfg.model_dump(mode="json"),
        collector=collector,
    )
    log.info(
        "rank %d/%d on %s: model %s, %s, chunk %d tokens, set up in %.1f s",
        dist_ctx.rank,
        dist_ctx.world_size,
        dist_ctx.device,
        config.model.size or config.model.hf_path,
        dtype,
        settings.chunk_tokens,
        time.perf_counter() - started,
    )
    if start_step >= config.train.max_steps:
        log.info("nothing to train: the checkpoint is at step %d of %d", start_step, config.train.max_steps)

    per_rank = config.train.global_batch // dist_ctx.world_size
    progress = ProgressLine(config.train.max_steps, enabled=dist_ctx.is_main)
    train_started = time.perf_counter()
    with progress, kineto_profiler(config, run_dir, dist_ctx) as profiler:
        for step in range(start_step + 1, config.train.max_steps + 1):
            collector.step_begin(step)
            step_started = time.perf_counter()
            with collector.span("data", Category.DATA):
                packs = stream.next_packs(config.train.global_batch)
                mine = packs[dist_ctx.rank * per_rank : (dist_ctx.rank + 1) * per_rank]
                micro_batches = [MicroBatch.from_pack(pack, dist_ctx.device) for pack in mine]
            data_wait = time.perf_counter() - step_started
            lr = scheduler.get_last_lr()[0]
            result = train_step(
                model,
                optimizer,
                micro_batches,
                GlobalBatch.of(packs),
                settings,
                dp_size=dist_ctx.world_size,
                collector=collector,
            )
            scheduler.step()
            step_time = time.perf_counter() - step_started
            skipped_total += result.skipped
            skipped_in_a_row = skipped_in_a_row + 1 if result.skipped else 0
            checkpoint_fields: dict[str, Any] = {}
            checkpointer.poll()
            if checkpointer.due(step):
                train_state = {
                    "scheduler": scheduler.state_dict(),
                    "data": stream.state_dict(),
                    "skipped_steps": skipped_total,
                    "skipped_in_a_row": skipped_in_a_row,
                }
                checkpoint_fields["checkpoint_stall_s"] = checkpointer.save(step, model, optimizer, train_state)
            collector.step_end(step)
            if profiler is not None:
                profiler.step()

            tokens = sum(len(pack.input_ids) for pack in packs)
            tokens_per_s = tokens / step_time
            lengths = [int(n) for pack in packs for n in np.diff(pack.cu_seqlens)]
            flops_per_token = training_flops_per_token(model_cfg, lengths)
            writer.append_rank_record(
                step,
                step_time_s=step_time,
                data_wait_s=data_wait,
                tokens=sum(len(pack.input_ids) for pack in mine),
                pack_ids=[pack.pack_id for pack in mine],
                attention_cost=sum(pack_cost(pack.pieces) for pack in mine),
                **checkpoint_fields,
                **memory_figures(dist_ctx.device),
            )
            if dist_ctx.is_main:
                fields: dict[str, Any] = {
                    "loss": result.loss,
                    "aux_loss": result.aux_loss,
                    "z_loss": result.z_loss,
                    "grad_norm": result.grad_norm,
                    "lr": lr,
                    "tokens": tokens,
                    "tokens_per_s": tokens_per_s,
                    "tokens_per_s_per_device": tokens_per_s / dist_ctx.world_size,
                    "skipped_lines": corpus.skipped_lines,
                    "skipped_steps": skipped_total,
                    "step_time_s": step_time,
                    "wall_s": time.perf_counter() - started,
                    "max_steps": config.train.max_steps,
                    **checkpoint_fields,
                    **resumed_fields,  # the first record after a resume says where it came from
                }
                resumed_fields = {}
                utilisation = mfu(flops_per_token, tokens_per_s / dist_ctx.world_size, peak)
                if utilisation is not None:
                    fields["mfu"] = utilisation
                if result.skipped:
                    fields["skipped"] = True
                writer.append_metrics(step, **fields)
                elapsed = time.perf_counter() - train_started
                done = step - start_step
                progress.update(step, result.loss, tokens_per_s, eta_s=elapsed / done * (config.train.max_steps - step))
            if result.skipped:
                log.warning(
                    "step %d skipped: loss %s, gradient norm %s (not finite)", step, result.loss, result.grad_norm
                )
            if skipped_in_a_row >= config.train.max_skipped_steps_in_a_row:
                raise TrainingStoppedError(
                    f"stopped at step {step}: {skipped_in_a_row} steps in a row had a loss or gradient that is not "
                    f"finite (train.max_skipped_steps_in_a_row = {config.train.max_skipped_steps_in_a_row}); "
                    "lower optim.lr or check the data"
                )
    checkpointer.close()
    log.info(
        "trained steps %d to %d in %.1f s", start_step + 1, config.train.max_steps, time.perf_counter() - train_started
    )
    return model
