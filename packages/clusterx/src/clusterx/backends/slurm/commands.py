"""Run Slurm's commands: sbatch, squeue, sacct (with and without -c), scancel.

One process per command for MANY jobs: ids are joined into one --jobs list (in chunks, so a command line
never grows without bound). Errors Slurm reports for jobs it no longer knows are answers, not failures.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from clusterx.errors import BackendError

from .options import SlurmOptions
from .records import SACCT_FIELDS, SQUEUE_FORMAT, SlurmRecord, parse_sacct, parse_sbatch_parsable, parse_squeue

IDS_PER_CALL = 500
# What sacct prints when the cluster has no slurmdbd (22.05: "Slurm accounting storage is disabled"),
# or when slurmdbd is down.
_NO_ACCOUNTING = ("accounting storage is disabled", "slurmdbd", "connection refused", "unable to contact")
_UNKNOWN_JOB = ("invalid job id", "already completed", "already finished", "job has finished")


class AccountingUnavailableError(Exception):
    """The queried accounting source does not exist on this cluster."""


def _chunks(ids: Sequence[str]) -> Iterator[list[str]]:
    for start in range(0, len(ids), IDS_PER_CALL):
        yield list(ids[start : start + IDS_PER_CALL])


class SlurmCommands:
    """The Slurm command-line tools, run with the backend's SLURM_CONF and folder."""

    def __init__(self, options: SlurmOptions) -> None:
        self.options = options

    def _program(self, name: str) -> str:
        return str(Path(self.options.bin_dir) / name) if self.options.bin_dir else name

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.options.slurm_conf:
            env["SLURM_CONF"] = self.options.slurm_conf
        return env

    def run(self, name: str, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        argv = [self._program(name), *args]
        try:
            return subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env=self._env(),
                timeout=self.options.command_timeout,
                check=False,
            )
        except FileNotFoundError:
            raise BackendError(
                f"{name} not found; install Slurm's client commands or set the Slurm backend option bin_dir"
            ) from None
        except subprocess.TimeoutExpired:
            raise BackendError(
                f"{name} did not answer within {self.options.command_timeout:g} s (is slurmctld up?)"
            ) from None

    def sbatch(self, script_path: Path) -> str:
        """Submit a script; returns 'JOBID' or 'JOBID;CLUSTER' as sbatch printed it."""
        # --export=NONE on the command line too: it overrides any SBATCH_EXPORT in the caller's environment.
        result = self.run("sbatch", ["--parsable", "--export=NONE", str(script_path)])
        if result.returncode != 0:
            raise BackendError(f"sbatch refused the job: {result.stderr.strip() or result.stdout.strip()}")
        try:
            job_id, cluster = parse_sbatch_parsable(result.stdout)
        except ValueError as exc:
            raise BackendError(str(exc)) from None
        return f"{job_id};{cluster}" if cluster else job_id

    def squeue(self, job_ids: Sequence[str], cluster: str | None) -> dict[str, SlurmRecord]:
        """Jobs slurmctld still holds (live, or ended less than MinJobAge ago), in one call per chunk."""
        records: dict[str, SlurmRecord] = {}
        for chunk in _chunks(job_ids):
            args = ["--noheader", "--states=all", f"--format={SQUEUE_FORMAT}", f"--jobs={','.join(chunk)}"]
            result = self.run("squeue", [*args, *_cluster_args(cluster)])
            if result.returncode != 0:
                if _mentions(result.stderr, _UNKNOWN_JOB):
                    continue  # none of these ids is known any more: an answer
                raise BackendError(f"squeue failed: {result.stderr.strip()}")
            records.update(parse_squeue(result.stdout))
        return records

    def sacct(self, job_ids: Sequence[str], cluster: str | None, completion_log: bool) -> dict[str, SlurmRecord]:
        """Finished jobs from slurmdbd (plain sacct) or from the job-completion log (`sacct -c`).

        Raises AccountingUnavailableError when the source does not exist on this cluster.
        """
        records: dict[str, SlurmRecord] = {}
        source = ["-c"] if completion_log else ["--allocations"]
        for chunk in _chunks(job_ids):
            args = [*source, "--parsable2", "--noheader", f"--format={SACCT_FIELDS}", f"--jobs={','.join(chunk)}"]
            result = self.run("sacct", [*args, *_cluster_args(cluster)])
            if result.returncode != 0:
                # sacct -c fails when there is no completion log (JobCompType=jobcomp/none, or no file yet);
                # plain sacct when there is no slurmdbd. Either way this source cannot answer.
                if completion_log or _mentions(result.stderr, _NO_ACCOUNTING):
                    raise AccountingUnavailableError(result.stderr.strip())
                raise BackendError(f"sacct failed: {result.stderr.strip()}")
            # With rc 0, sacct -c may still print "Unknown type" lines to stderr for records holding spaces
            # (a WorkDir with a space): the fields asked for are still right, so stderr is ignored.
            records.update(parse_sacct(result.stdout))
        return records

    def scancel(self, job_id: str, cluster: str | None) -> None:
        result = self.run("scancel", [job_id, *_cluster_args(cluster)])
        if result.returncode != 0 and not _mentions(result.stderr, _UNKNOWN_JOB):
            raise BackendError(f"scancel {job_id} failed: {result.stderr.strip()}")


def _cluster_args(cluster: str | None) -> list[str]:
    return [f"--clusters={cluster}"] if cluster else []


def _mentions(text: str, needles: Sequence[str]) -> bool:
    lowered = text.lower()
    return any(needle in lowered for needle in needles)
