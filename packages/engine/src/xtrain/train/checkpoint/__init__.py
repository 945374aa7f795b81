"""Checkpoints of a training run: torch.distributed.checkpoint (DCP) folders under RUN_DIR/checkpoints/step-N/.

- :mod:`.manifest`: the completion marker (``COMPLETE``, written last), which also carries the step, the world
  it was saved from, the training state that is the same on every rank, and the resolved config.
- :mod:`.locate`: what ``--resume auto|PATH|none`` means: which checkpoint, or a user error naming it.
- :mod:`.compat`: whether a checkpoint fits the model about to be trained (keys and shapes), before anything
  is written.
- :mod:`.state`: what a rank saves and loads (model, optimizer, RNG states under per-rank keys).
- :mod:`.saver`: saving during training (sync or async, one save in flight, marker last, old ones deleted).
- :mod:`.export`: a checkpoint as a Hugging Face folder (``xtrain export``, ``checkpoint.hf_every_steps``).
"""
