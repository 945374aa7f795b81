"""clusterx's command line and Python API on the REAL one-node Slurm: submit, describe --json, wait, cancel.

The 2-process torchrun job of the issue's "done when", run through `clusterx submit --backend slurm`.
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

from tests.clusterx.slurm.conftest import SlurmCluster
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
    f.write(f"{dist.get_world_size()} {value.item()}")
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


def test_torchrun_job_through_the_cli(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    cli = Cli(tmp_path, slurm_cluster)
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    torchrun = str(REPO_ROOT / ".venv" / "bin" / "torchrun")
    job_id = cli.submit(
        "--name=allreduce", "--procs-per-node=2", "--cpus-per-node=2", "--mem=2G", "--",
        torchrun, "--nproc-per-node", "2", str(script),
    )  # fmt: skip
    waited = cli.run("wait", str(job_id))
    record = cli.json("describe", str(job_id), "--json")
    assert waited.returncode == 0, (waited.stdout, record["failure_reason"], Path(record["log_paths"]["stderr"]))
    assert (record["state"], record["raw_state"], record["exit_code"]) == ("SUCCEEDED", "COMPLETED", 0)
    assert record["hosts"] == [slurm_cluster.node]
    assert record["rank_to_host"] == {"0": slurm_cluster.node, "1": slurm_cluster.node}
    run_dir = Path(record["run_dir"])
    for rank in (0, 1):
        assert (run_dir / f"rank-{rank}.txt").read_text() == "2 3.0"  # both ranks took part in the all_reduce
    assert "#SBATCH --ntasks-per-node=1" in record["rendered_request"]
    assert Path(record["log_paths"]["stdout"]).is_file()
    assert record["started_at"] is not None
    assert record["ended_at"] is not None


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
        record = client.wait(job["id"], timeout_s=60)
        assert record["state"] == "SUCCEEDED"
        assert record["hosts"] == [slurm_cluster.node]
        assert client.log_file(job["id"]).read_text() == f"attempt 1 of job {job['id']}\n"
    finally:
        client.close()
