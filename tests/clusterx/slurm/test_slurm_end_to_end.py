"""clusterx's command line and Python API on the REAL test Slurm: submit, describe --json, wait, cancel.

A 2-node × 2-process torchrun job through `clusterx submit --backend slurm`, and a job Slurm requeues.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from clusterx import Client
from clusterx.spec import JobSpec, env_from_shell

from tests.clusterx.conftest import wait_until
from tests.clusterx.slurm.conftest import MULTI_NODE_PARTITION, SlurmCluster
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm")]

CLUSTERX = Path(sys.executable).parent / "clusterx"
ALLREDUCE = """\
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
with open(os.path.join(os.environ["CLUSTERX_RUN_DIR"], f"rank-{dist.get_rank()}.txt"), "w") as f:
    env = os.environ
    f.write(f"{dist.get_world_size()} {value.item()} {env['SLURMD_NODENAME']} {env['TORCHELASTIC_RUN_ID']}")
dist.destroy_process_group()
"""


class Cli:
    def __init__(self, tmp_path: Path, cluster: SlurmCluster) -> None:
        self.db = tmp_path / "jobs.db"
        self.env = {**os.environ, "CLUSTERX_RUNS_DIR": str(tmp_path / "runs"), "OMP_NUM_THREADS": "1"}
        self.backend_args = [
            "--backend=slurm",
            f"--backend-option=slurm_conf={cluster.conf}",
            f"--backend-option=state_dir={cluster.status_dir}",
        ]

    def run(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(CLUSTERX), "--db", str(self.db), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def json(self, *args: str) -> Any:
        result = self.run(*args)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def submit(self, *args: str) -> int:
        record = self.json("submit", *self.backend_args, "--json", *args)
        assert record["state"] == "QUEUED", record
        assert record["backend_job_id"].isdigit()
        return int(record["id"])


def test_two_node_torchrun_job_through_the_cli(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """2 nodes × 2 processes: one torchrun agent per node (both slurmd of the test cluster), four ranks in one
    all_reduce, and `describe --json` telling which host each rank ran on."""
    cli = Cli(tmp_path, slurm_cluster)
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    torchrun = str(REPO_ROOT / ".venv" / "bin" / "torchrun")
    job_id = cli.submit(
        "--name=allreduce", f"--partition={MULTI_NODE_PARTITION}", "--nodes=2", "--procs-per-node=2",
        "--cpus-per-node=2", "--mem=1G", "--", torchrun, "--nproc-per-node", "2", str(script),
    )  # fmt: skip
    waited = cli.run("wait", str(job_id))
    record = cli.json("describe", str(job_id), "--json")
    assert waited.returncode == 0, (waited.stdout, record["failure_reason"], Path(record["log_paths"]["stderr"]))
    assert (record["state"], record["raw_state"], record["exit_code"]) == ("SUCCEEDED", "COMPLETED", 0)
    hosts = record["hosts"]
    assert sorted(hosts) == sorted(slurm_cluster.nodes)  # both nodes, in Slurm's order for the job
    assert record["rank_to_host"] == {"0": hosts[0], "1": hosts[0], "2": hosts[1], "3": hosts[1]}
    run_dir = Path(record["run_dir"])
    for rank, host in record["rank_to_host"].items():
        world, total, node, run_id = (run_dir / f"rank-{rank}.txt").read_text().split()
        assert (world, float(total)) == ("4", 10.0)  # all four ranks took part in the all_reduce
        assert node == host  # the rank ran where the record says (its slurmd's node name)
        assert run_id == f"clusterx-{record['backend_job_id']}"  # the rendezvous id the script gave torchrun
    assert "#SBATCH --nodes=2" in record["rendered_request"]
    assert "#SBATCH --ntasks-per-node=1" in record["rendered_request"]
    assert record["started_at"] is not None
    assert record["ended_at"] is not None


def test_a_job_slurm_requeues_runs_again_as_the_next_attempt(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """--requeue on Slurm behaves like --max-retries on the local backend from the user's side: the job stays live,
    each run is the next attempt (CLUSTERX_ATTEMPT, the attempts list), in the same run directory."""
    client = Client(str(tmp_path / "api.db"), runs_dir=tmp_path / "runs", poll_interval_s=0)
    try:
        script = (
            'echo "$CLUSTERX_ATTEMPT" >> "$CLUSTERX_RUN_DIR/attempts.txt"; [ "$CLUSTERX_ATTEMPT" -ge 2 ] || sleep 300'
        )
        spec = JobSpec(
            command=["/bin/bash", "-c", script],
            env=env_from_shell(os.environ),
            mem_per_node="100M",
            requeue=True,
            backend="slurm",
            backend_options={"slurm_conf": str(slurm_cluster.conf), "state_dir": str(slurm_cluster.status_dir)},
        )
        job = client.submit(spec)
        assert "#SBATCH --requeue\n" in job.rendered_request
        attempts_file = Path(job.run_dir) / "attempts.txt"
        wait_until(lambda: attempts_file.exists() and attempts_file.read_text() == "1\n", timeout_s=60)
        slurm_id = job.backend_job_id
        assert slurm_cluster.run("scontrol", "requeue", slurm_id).returncode == 0
        # Slurm holds a requeued batch job back for a while (BeginTime); let it go as soon as it waits again.
        wait_until(lambda: client.describe(job.id).attempt == 2, timeout_s=60)
        wait_until(
            lambda: slurm_cluster.run("scontrol", "update", f"JobId={slurm_id}", "StartTime=now").returncode == 0
        )
        done = client.wait(job.id, timeout_s=120)
        history = [(e.to_state, e.message) for e in done.events]
        job_log = (Path(job.run_dir) / "clusterx" / "attempt-1" / "stderr.log").read_text()
        diagnosis = f"events {history}; job stderr {job_log!r}; slurmctld:\n{slurm_cluster.log_tail()}"
        assert (done.state, done.attempt, done.backend_job_id) == ("SUCCEEDED", 2, slurm_id), diagnosis
        assert attempts_file.read_text() == "1\n2\n"
        assert [(a.attempt, a.state, a.backend_job_id) for a in done.attempts] == [
            (1, "PREEMPTED", slurm_id),
            (2, "SUCCEEDED", slurm_id),
        ]
        assert "requeued by slurm" in done.attempts[0].reason
        states = [e.to_state for e in done.events]
        assert states.index("SUCCEEDED") == len(states) - 1  # live between attempts; only the last end is final
    finally:
        client.close()


def test_wait_exit_status_follows_the_end_state(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    cli = Cli(tmp_path, slurm_cluster)
    failing = cli.submit("--", "/bin/sh", "-c", "echo about to fail; exit 3")
    sleeping = cli.submit("--", "sleep", "300")
    assert cli.run("wait", str(failing)).returncode == 1  # FAILED
    record = cli.json("describe", str(failing), "--json")
    assert (record["state"], record["exit_code"], record["failure_reason"]) == ("FAILED", 3, "exited with status 3")
    logs = cli.run("logs", str(failing))
    assert logs.stdout == "about to fail\n", logs.stderr

    cancelled = cli.run("cancel", str(sleeping))
    assert cancelled.returncode == 0, cancelled.stderr
    assert cli.run("wait", str(sleeping)).returncode == 2  # CANCELLED


def test_dryrun_prints_the_sbatch_script_and_stores_nothing(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    cli = Cli(tmp_path, slurm_cluster)
    result = cli.run("submit", *cli.backend_args, "--dryrun", "--nodes=2", "--gpus-per-node=4", "--", "python", "t.py")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("#!/bin/bash\n")
    assert "#SBATCH --nodes=2\n" in result.stdout
    assert "#SBATCH --gres=gpu:4\n" in result.stdout
    assert cli.json("list", "--json") == []


def test_python_api_on_slurm(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    client = Client(str(tmp_path / "api.db"), runs_dir=tmp_path / "runs", poll_interval_s=0.5)
    try:
        spec = JobSpec(
            command=["/bin/sh", "-c", 'echo "attempt $CLUSTERX_ATTEMPT of job $CLUSTERX_JOB_ID"'],
            env=env_from_shell(os.environ),
            mem_per_node="100M",
            backend="slurm",
            backend_options={"slurm_conf": str(slurm_cluster.conf), "state_dir": str(slurm_cluster.status_dir)},
        )
        job = client.submit(spec)
        record = client.wait(job.id, timeout_s=60)
        assert record.state == "SUCCEEDED"
        assert record.hosts == [slurm_cluster.node]
        assert client.log_file(job.id).read_text() == f"attempt 1 of job {job.id}\n"
    finally:
        client.close()
