"""`xtrain eval CONFIG --checkpoint PATH|RUN_DIR`: the held-out loss of a saved checkpoint.

Each rank builds the model as training does (the same layout check, meshes, FSDP), loads the checkpoint's
weights through DCP (only the model: resharded to this world size as a resume would be), and evaluates the
``[eval]`` packs of CONFIG exactly as a training run evaluates them (:mod:`xtrain.train.evaluate`). Rank 0
prints one JSON line: ``{"checkpoint", "step", "eval_loss", "eval_ppl", "eval_packs", "samples"}``
(``samples``: the greedy continuations of ``eval.sample_prompts``, [] without prompts).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from xtrain.config import TrainConfig
from xtrain.errors import CheckpointError, ConfigError
from xtrain.model.config import ModelConfig
from xtrain.parallel.distributed import barrier, close_distributed, init_distributed
from xtrain.train.build import build_model, compute_dtype, loss_settings, resolve_model_config
from xtrain.train.checkpoint.locate import ResumePoint, open_checkpoint
from xtrain.train.checkpoint.parts import ModelPart
from xtrain.train.evaluate import Evaluator, eval_packs
from xtrain.train.launch import check_world_size
from xtrain.train.sampling import Sampler

log = logging.getLogger("xtrain")


def check_eval(config: TrainConfig, checkpoint: Path) -> ResumePoint:
    """What must hold before any process starts: an ``[eval]`` section and a complete checkpoint of this model."""
    if not config.eval.enabled:
        raise ConfigError("eval.sources is empty: the config names no held-out data to evaluate on ([eval])")
    point = open_checkpoint(checkpoint, log.warning)
    saved = ModelConfig.model_validate(point.manifest.model_config)
    mine = resolve_model_config(config)
    if saved.model_dump(exclude={"attention_backend"}) != mine.model_dump(exclude={"attention_backend"}):
        raise CheckpointError(f"{point.folder} holds another model than the config's [model] describes")
    return point


def evaluate_checkpoint(config: TrainConfig, checkpoint: Path) -> None:
    """One rank's part of ``xtrain eval`` (under torchrun, or alone)."""
    dist_ctx = init_distributed()
    try:
        point = check_eval(config, checkpoint)
        layout = check_world_size(config, dist_ctx.world_size, dist_ctx.local_world_size)
        model_cfg = resolve_model_config(config)
        model = build_model(config, model_cfg, dist_ctx, layout, None)
        dcp_load({"model": ModelPart(model)}, checkpoint_id=point.folder)
        settings = loss_settings(config, model_cfg, compute_dtype(config, dist_ctx.device), dist_ctx.device)
        packs = eval_packs(config, dist_ctx, barrier, log.info)
        result = Evaluator(config, packs, settings, dist_ctx).evaluate(model)
        samples = Sampler(config, dist_ctx.device).sample(model) if config.eval.sample_prompts else []
        if dist_ctx.is_main:
            figures = {
                "checkpoint": str(point.folder),
                "step": point.step,
                "eval_loss": result.loss,
                "eval_ppl": result.ppl,
                "eval_packs": len(packs),
                "samples": [sample.model_dump(mode="json") for sample in samples],
            }
            print(json.dumps(figures), flush=True)
    finally:
        close_distributed()
