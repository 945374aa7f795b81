"""The training job: ``xtrain train CONFIG.toml``.

- ``launch.py``: the command line's side: validate before any process starts, start torchrun for ``--nproc``.
- ``trainer.py``: one process's run: process group, model (sharded, materialised), data, loop, run directory.
- ``step.py``: one optimizer step: micro-batches, the globally normalised losses, backward, clipping, update.
- ``optimizer.py``, ``schedule.py``: AdamW and its learning-rate schedule.
- ``metrics.py``: throughput, MFU and memory figures of a step.
"""
