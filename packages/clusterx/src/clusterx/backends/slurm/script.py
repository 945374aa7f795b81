"""Render the sbatch script of one attempt of a job. Pure functions: no Slurm needed, no file written.

Choices (docs/clusterx-slurm.md explains them at length):
- torchrun launcher: ONE task per node runs torchrun, which starts procs_per_node workers itself; the task
  holds all the node's CPUs. This is how torchrun is meant to run under Slurm (its agent restarts and monitors
  the local workers); the rendezvous is static, one agent per node, ranked by SLURM_NODEID.
- srun launcher: procs_per_node tasks per node, each with its share of the CPUs, ranks from SLURM_PROCID.
- Values go into the script through shlex.quote; values on #SBATCH lines must not hold line breaks (a line break
  would start a new directive), and the job name is reduced to a safe alphabet because Slurm's job-completion
  log is a space-separated key=value file that a name like "x JobState=COMPLETED" would corrupt.
"""

from __future__ import annotations

import functools
import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath

from clusterx.errors import SpecError
from clusterx.jobenv import job_environment
from clusterx.spec import JobSpec

from .options import SlurmOptions

_SAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._+-]")
_MAX_JOB_NAME = 64
# Rendezvous ports: 15000-29999 lies below Linux's ephemeral range (32768-60999), so a port derived from the
# job id does not collide with an outgoing connection's port; two jobs on one host collide only when their ids
# are 15000 apart.
RDZV_PORT_BASE = 15000
RDZV_PORT_SPAN = 15000


@dataclass(frozen=True)
class LogPaths:
    stdout: Path
    stderr: Path


def log_paths_for(log_dir: Path) -> LogPaths:
    return LogPaths(stdout=log_dir / "stdout.log", stderr=log_dir / "stderr.log")


def status_file_path(state_dir: Path, slurm_job_id: str) -> Path:
    """The exit-code file the batch script writes (and rewrites) for job `slurm_job_id`."""
    return state_dir / f"{slurm_job_id}.status"


def slurm_job_name(name: str) -> str:
    """A job name Slurm's files cannot misread: letters, digits and ._+- only, at most 64 characters."""
    safe = _SAFE_NAME_CHARS.sub("_", name)[:_MAX_JOB_NAME]
    return safe or "clusterx-job"


def _directive_value(what: str, value: str) -> str:
    if any(char in value for char in "\n\r\0"):
        raise SpecError(f"{what} {value!r} holds a line break or NUL; Slurm cannot take it on an #SBATCH line")
    return shlex.quote(value)


def _sbatch_filename(path: Path) -> str:
    """A path for --output/--error: '%' is Slurm's pattern character, '%%' a literal one."""
    return str(path).replace("%", "%%")


def time_limit_minutes(seconds: int) -> int:
    """Slurm counts time limits in whole minutes; round up so a job never gets less than it asked for."""
    return max(1, math.ceil(seconds / 60))


def uses_torchrun(spec: JobSpec, options: SlurmOptions) -> bool:
    if options.launcher == "auto":
        return PurePath(spec.command[0]).name == "torchrun"
    return options.launcher == "torchrun"


def sbatch_directives(
    spec: JobSpec, options: SlurmOptions, log_dir: Path, workdir: Path, torchrun: bool
) -> list[tuple[str, str | None]]:
    """(option, value) pairs of the #SBATCH lines, in a fixed order (value None: a flag)."""
    tasks_per_node = 1 if torchrun else spec.procs_per_node
    cpus_per_task = spec.cpus_needed if torchrun else max(1, spec.cpus_needed // spec.procs_per_node)
    logs = log_paths_for(log_dir)
    directives: list[tuple[str, str | None]] = [
        ("job-name", slurm_job_name(spec.name)),
        ("nodes", str(spec.nodes)),
        ("ntasks-per-node", str(tasks_per_node)),
        ("cpus-per-task", str(cpus_per_task)),
    ]
    if spec.gpus_per_node > 0:
        directives.append(("gres", f"gpu:{spec.gpus_per_node}"))
    if spec.mem_per_node is not None:
        directives.append(("mem", f"{spec.mem_per_node}M"))
    if spec.time_limit is not None:
        directives.append(("time", str(time_limit_minutes(spec.time_limit))))
    if spec.partition:
        directives.append(("partition", spec.partition))
    for key in ("account", "qos", "constraint"):
        value = getattr(options, key)
        if value:
            directives.append((key, value))
    directives += [
        ("output", _sbatch_filename(logs.stdout)),
        ("error", _sbatch_filename(logs.stderr)),
        ("chdir", str(workdir)),
        # The submitting shell's environment stays out; the script exports the job's own (below).
        ("export", "NONE"),
        # Whether Slurm may put the job back in its queue itself (node failure, preemption, scontrol requeue):
        # what the spec says, never the cluster's default (JobRequeue).
        ("requeue" if spec.requeue else "no-requeue", None),
    ]
    return directives


def launch_command(spec: JobSpec, options: SlurmOptions, torchrun: bool) -> str:
    """The srun line that starts the job's processes (torchrun agents, or the command itself)."""
    srun = _tool(options, "srun")
    if not torchrun:
        return f"{srun} --export=ALL --kill-on-bad-exit=1 -- {shlex.join(spec.command)}"
    if PurePath(spec.command[0]).name == "torchrun":
        program, user_args = spec.command[0], spec.command[1:]
    else:
        program = options.torchrun
        no_python = [] if spec.command[0].endswith(".py") else ["--no-python"]
        user_args = no_python + spec.command
    # Evaluated inside each srun task (one per node), where SLURM_NODEID is that node's index in the allocation.
    # A static rendezvous: global rank = node rank × procs per node + local rank, so ranks follow Slurm's node
    # order, which is what rank_to_host reports (c10d would rank the agents by sorted host name and pid instead).
    # The user's own torchrun options come after ours, so they win where both are given (argparse keeps the last).
    inner = (
        'exec "$0" --nnodes="$SLURM_NNODES" --node-rank="$SLURM_NODEID" '
        f"--nproc-per-node={spec.procs_per_node} --rdzv-backend=static "
        '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="clusterx-$SLURM_JOB_ID" "$@"'
    )
    return (
        f"{srun} --export=ALL --kill-on-bad-exit=1 --ntasks-per-node=1 -- /bin/bash -c {shlex.quote(inner)} "
        f"{shlex.join([program, *user_args])}"
    )


def _tool(options: SlurmOptions, name: str) -> str:
    return shlex.quote(str(Path(options.bin_dir) / name)) if options.bin_dir else name


def render_sbatch_script(
    spec: JobSpec,
    *,
    job_id: int,
    attempt: int,
    log_dir: Path,
    options: SlurmOptions,
    submit_dir: Path,
) -> str:
    """The whole batch script of one attempt: the template with this job's values."""
    torchrun = uses_torchrun(spec, options)
    workdir = Path(spec.workdir) if spec.workdir else submit_dir
    run_dir = spec.run_dir or str(log_dir)
    directives = [
        f"#SBATCH --{key}" if value is None else f"#SBATCH --{key}={_directive_value(key, value)}"
        for key, value in sbatch_directives(spec, options, log_dir, workdir, torchrun)
    ]
    environment = job_environment(spec, backend="slurm", job_id=job_id, attempt=attempt, run_dir=run_dir)
    values = {
        "job_id": str(job_id),
        "attempt": str(attempt),
        "directives": "\n".join(directives),
        "state_dir": shlex.quote(str(options.resolved_state_dir())),
        "time_limit_s": str(time_limit_minutes(spec.time_limit) * 60 if spec.time_limit else 0),
        "procs_per_node": str(spec.procs_per_node),
        "squeue": _tool(options, "squeue"),
        "scontrol": _tool(options, "scontrol"),
        "environment": "\n".join(f"export {key}={shlex.quote(value)}" for key, value in environment.items()),
        "rdzv_port_base": str(RDZV_PORT_BASE),
        "rdzv_port_span": str(RDZV_PORT_SPAN),
        "launch": launch_command(spec, options, torchrun),
    }
    return fill_template(sbatch_template(), values)


TEMPLATE_PATH = Path(__file__).with_name("sbatch.template.sh")
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


@functools.cache
def sbatch_template() -> str:
    return TEMPLATE_PATH.read_text()


def fill_template(template: str, values: Mapping[str, str]) -> str:
    """Every {{name}} replaced by values[name], in one pass (a value holding '{{' is never read again)."""
    missing = sorted(set(_PLACEHOLDER.findall(template)) - set(values))
    if missing:
        raise KeyError(f"no value for {missing} in the sbatch template")
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)
