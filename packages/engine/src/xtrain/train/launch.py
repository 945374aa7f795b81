"""The command line's side of ``xtrain train``: check everything cheap before any process starts, then run.

Three ways a training process comes to life, one code path in the end (``trainer.train``):

- ``xtrain train CONFIG``: this process is the whole job (world size 1).
- ``xtrain train CONFIG --nproc N``: this process validates the config, checks the files it names, builds the
  token cache (so a bad data source is reported here, once), then starts torchrun (``--standalone``, N
  processes on this node) running ``python -m xtrain train ...`` and returns its outcome.
- ``torchrun ... -m xtrain train CONFIG``: torchrun started this process (one rank of a job that may span
  nodes through torchrun's rendezvous); it trains.

User errors in a rank (exit code 2) are collected through a folder named by XTRAIN_ERROR_DIR, so the launcher
prints each distinct message once instead of torchrun's failure report.

The launcher of ``--nproc`` holds the run directory's lock (:mod:`.rundir_lock`) while the job runs, and its job
dies with it (:mod:`.lifeline`): SIGTERM or SIGINT to the launcher is passed on to torchrun's agent, which stops
the ranks; if the agent has not ended :data:`STOP_TIMEOUT_S` seconds later the launcher SIGKILLs it, and the ranks
go with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType

from xtrain.config import TrainConfig, load_train_config, missing_paths
from xtrain.errors import ConfigError
from xtrain.parallel.layout import ParallelLayout, check_layout
from xtrain.train.lifeline import PARENT_PID_ENV
from xtrain.train.rundir_lock import RunDirLock, refuse_if_in_use

ERROR_DIR_ENV = "XTRAIN_ERROR_DIR"
"""Folder where each rank writes the message of a user error (set by the launcher for its ranks)."""
RUN_DIR_ENV = "CLUSTERX_RUN_DIR"
"""A clusterx job's run directory: where ``xtrain train`` writes when no --run-dir is given."""
RANK_MODULE = "xtrain.train.lifeline"
"""What torchrun runs in each rank: ``xtrain ARGS``, bound to the agent (:mod:`.lifeline`)."""
STOP_TIMEOUT_S = 60.0
"""After SIGTERM or SIGINT, how long the launcher waits for torchrun's agent to stop the ranks before SIGKILL."""


def resolve_run_dir(run_dir: Path | None, config_path: Path) -> Path:
    """--run-dir, else the clusterx job's run directory, else runs/<config name> under the working directory."""
    if run_dir is not None:
        return run_dir.resolve()
    from_job = os.environ.get(RUN_DIR_ENV)
    if from_job:
        return Path(from_job).resolve()
    return (Path("runs") / config_path.stem).resolve()


def load_and_check(config_path: Path, overrides: tuple[str, ...]) -> TrainConfig:
    """The validated config, with every file and folder it names present and the optional extras of its trackers
    installed (ConfigError otherwise)."""
    from xtrain.train.tracking.extras import check_tracker_extras  # noqa: PLC0415

    config = load_train_config(config_path, overrides)
    check_tracker_extras(config)
    problems = missing_paths(config)
    if problems:
        raise ConfigError(
            f"{config_path}: {problems[0]}" + (f" (and {len(problems) - 1} more)" if problems[1:] else "")
        )
    return config


def check_world_size(config: TrainConfig, world_size: int, processes_per_node: int | None = None) -> ParallelLayout:
    """What the number of processes must satisfy (checked by the launcher before it starts them, and by every
    rank under torchrun); the job's parallel layout. ``processes_per_node`` None: all on this node (``--nproc``,
    torchrun --standalone)."""
    if config.train.global_batch % world_size:
        raise ConfigError(
            f"train.global_batch = {config.train.global_batch} must be a multiple of the number of processes "
            f"({world_size}): each rank runs global_batch / processes packs per step"
        )
    num_experts = None
    if config.parallel.ep_size > 1:  # the model's config is read only when its experts are split
        from xtrain.train.build import resolve_model_config  # noqa: PLC0415

        moe = resolve_model_config(config).moe
        num_experts = moe.num_experts if moe is not None else None
    layout = check_layout(config.parallel, world_size, processes_per_node, num_experts)
    if config.eval.enabled and config.eval.batches % world_size:
        raise ConfigError(
            f"eval.batches = {config.eval.batches} must be a multiple of the number of processes ({world_size}): "
            "each rank evaluates eval.batches / processes packs"
        )
    return layout


def check_resume(resume: str, run_dir: Path, config: TrainConfig) -> None:
    """``--resume auto|PATH|none`` against the run directory and the model, before any process starts: a run
    directory that a live run holds is refused (naming the holder's pid), and a path that is not a checkpoint, an
    incomplete or corrupted one or one of another model is a CheckpointError naming it. Reads only. The ranks
    decide again (under torchrun nothing ran this), and log the warnings."""
    from xtrain.train.build import resolve_model_config  # noqa: PLC0415
    from xtrain.train.checkpoint.resume import decide  # noqa: PLC0415 (torch: only once a config is valid)

    refuse_if_in_use(run_dir)
    decide(resume, run_dir, resolve_model_config(config))


def launch_torchrun(config_path: Path, run_dir: Path, overrides: tuple[str, ...], resume: str, nproc: int) -> int:
    """Lock the run directory, start ``nproc`` ranks of ``xtrain train`` on this node through torchrun and wait;
    the exit code of the job (2: user error, or a run directory that a live run holds)."""
    arguments = ["train", str(config_path.resolve()), "--run-dir", str(run_dir), "--resume", resume]
    with RunDirLock.acquire(run_dir) as lock:
        return launch_command(arguments, overrides, nproc, lock=lock)


def launch_command(arguments: list[str], overrides: tuple[str, ...], nproc: int, lock: RunDirLock | None = None) -> int:
    """Start ``nproc`` ranks of ``xtrain ARGUMENTS`` on this node through torchrun and wait; the exit code of the
    job (2: a user error, whose message each rank left for the launcher to print once; 128 + N: stopped by
    signal N). torchrun's agent inherits ``lock``'s file, so the lock lasts as long as the job."""
    command = [sys.executable, "-m", "xtrain.train.torchrun", "--standalone", f"--nproc-per-node={nproc}"]
    command += ["-m", RANK_MODULE, *arguments]
    for override in overrides:
        command += ["--set", override]
    env = dict(os.environ)
    # Without this each rank would start as many compute threads as there are cores, and N ranks would fight.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    env[PARENT_PID_ENV] = str(os.getpid())
    with tempfile.TemporaryDirectory(prefix="xtrain-errors-") as errors:
        env[ERROR_DIR_ENV] = errors
        agent = subprocess.Popen(command, env=env, pass_fds=() if lock is None else (lock.fd,))
        code, stopped_by = _wait_passing_on_stops(agent)
        messages = sorted({path.read_text().strip() for path in Path(errors).glob("rank-*.txt")})
    for message in messages:
        print(f"xtrain: error: {message}", file=sys.stderr)
    if messages:
        return 2
    if stopped_by is not None:
        name = signal.Signals(stopped_by).name
        print(f"xtrain: stopped by {name}; the ranks have ended (continue with --resume auto)", file=sys.stderr)
        return 128 + stopped_by
    if code < 0:
        name = signal.Signals(-code).name
        print(f"xtrain: torchrun's agent (pid {agent.pid}) was killed by {name}; its ranks died with it",
              file=sys.stderr)  # fmt: skip
        return 128 - code
    return code


def _wait_passing_on_stops(agent: subprocess.Popen[bytes]) -> tuple[int, int | None]:
    """Wait for torchrun's agent, passing SIGTERM and SIGINT on to it as SIGTERM (the agent stops the ranks), and
    SIGKILLing it if it has not ended :data:`STOP_TIMEOUT_S` seconds after the first; (exit code, first stop
    signal or None)."""
    stops: list[tuple[int, float]] = []

    def pass_on(signum: int, _frame: FrameType | None) -> None:
        stops.append((signum, time.monotonic()))
        if agent.poll() is None:
            agent.send_signal(signal.SIGTERM)

    in_main_thread = threading.current_thread() is threading.main_thread()  # where Python lets handlers be set
    stop_signals = (signal.SIGTERM, signal.SIGINT) if in_main_thread else ()
    previous = {signum: signal.signal(signum, pass_on) for signum in stop_signals}
    try:
        while True:
            try:
                code = agent.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if stops and time.monotonic() - stops[0][1] > STOP_TIMEOUT_S:
                    agent.kill()  # the ranks die with it (parent-death signal)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return code, (stops[0][0] if stops else None)


def report_user_error(message: str) -> bool:
    """In a rank started by the launcher, leave the message for it to print once; False elsewhere (then the
    caller prints it)."""
    folder = os.environ.get(ERROR_DIR_ENV)
    if not folder:
        return False
    Path(folder, f"rank-{os.environ.get('RANK', '0')}.txt").write_text(message)
    return True
