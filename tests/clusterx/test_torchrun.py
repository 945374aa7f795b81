"""A 2-process torchrun job (gloo all_reduce) submitted with `clusterx submit` on the local backend runs, and
`clusterx describe --json` shows its hosts and run directory."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "data" / "allreduce.py"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.xdist_group("clusterx-daemon")
def test_torchrun_job_on_the_local_backend(sqlite_db: str, tmp_path: Path, stop_daemons: Callable[[str], None]) -> None:
    stop_daemons(sqlite_db)
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "CLUSTERX_DB": sqlite_db, "CLUSTERX_RUNS_DIR": str(tmp_path / "runs")}
    clusterx = [str(Path(sys.executable).parent / "clusterx")]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*clusterx, *args], env=env, capture_output=True, text=True, timeout=300, check=False)

    submitted = run("submit", "--json", "--name", "allreduce", "--procs-per-node", "2", "--",
                    str(torchrun), "--nproc-per-node", "2", str(SCRIPT))  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = str(json.loads(submitted.stdout)["id"])
    waited = run("wait", job_id)
    described = json.loads(run("describe", job_id, "--json").stdout)
    assert waited.returncode == 0, (waited.stdout, Path(described["log_paths"]["stderr"]).read_text())
    run_dir = Path(described["run_dir"])
    assert run_dir.is_dir() and described["hosts"] == [socket.gethostname()]
    assert described["rank_to_host"] == {"0": socket.gethostname(), "1": socket.gethostname()}
    results = [json.loads((run_dir / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world"] == 2 and r["sum"] == 3.0 and r["job"] == job_id for r in results)
