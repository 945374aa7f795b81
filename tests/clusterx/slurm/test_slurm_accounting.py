"""The Slurm backend on a cluster WITH accounting (slurmdbd on MariaDB, started by conftest's
slurm_accounting_cluster): finished jobs are read from `sacct`, in one call for all of them, and the
job-completion log is never asked."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from clusterx.states import JobState

from tests.clusterx.slurm.conftest import SlurmCluster, wait_for_status
from tests.clusterx.slurm.test_slurm_cluster import is_terminal, request_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm")]


def test_finished_jobs_come_from_slurmdbd(slurm_accounting_cluster: SlurmCluster, tmp_path: Path) -> None:
    cluster = slurm_accounting_cluster
    backend = cluster.backend()
    exits = [0, 3, 0]
    ids = [backend.submit(request_for(tmp_path, ["/bin/sh", "-c", f"exit {code}"])) for code in exits]
    for job_id in ids:
        wait_for_status(backend, job_id, is_terminal)
    # Once squeue has forgotten them (MinJobAge=2), only accounting can tell.
    deadline = time.monotonic() + 30
    while backend.commands.squeue(ids, None) and time.monotonic() < deadline:
        time.sleep(0.5)
    commands: list[list[str]] = []
    backend = cluster.backend(accounting="sacct")  # slurmdbd or nothing: the completion log must not be needed
    real_run = backend.commands.run

    def counting_run(name: str, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        commands.append([name, *args])
        return real_run(name, args)

    backend.commands.run = counting_run  # type: ignore[method-assign]  # a spy: it still runs the real command
    statuses = backend.poll(ids)
    assert [commands_run[0] for commands_run in commands] == ["squeue", "sacct"]  # one of each, for all three
    assert "-c" not in commands[1] and "--allocations" in commands[1]
    assert [(statuses[i].state, statuses[i].exit_code) for i in ids] == [
        (JobState.SUCCEEDED, 0),
        (JobState.FAILED, 3),
        (JobState.SUCCEEDED, 0),
    ]
    assert [statuses[i].raw_state for i in ids] == ["COMPLETED", "FAILED", "COMPLETED"]
    assert all(statuses[i].hosts == (cluster.node,) and statuses[i].ended_at is not None for i in ids)
    assert not (cluster.root / "log" / "jobcomp.txt").exists()  # no completion log on this cluster
