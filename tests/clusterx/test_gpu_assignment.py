"""GPU hand-out by the daemon, on the CPU: a daemon told it has four GPUs gives each job its own ones through
CUDA_VISIBLE_DEVICES, and a job waits while its GPUs are taken. (Discovery through NVML itself needs a GPU.)"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from clusterx import Client, JobSpec
from clusterx.daemon.resources import gpu_indices
from clusterx.daemon.service import Daemon
from clusterx.store import Capacity

from tests.clusterx.conftest import wait_until


def test_gpu_discovery_is_quiet_without_a_gpu() -> None:
    found = gpu_indices()  # no exception on a machine without a driver; the GPUs' indices on one with them
    assert found == list(range(len(found)))


@pytest.mark.xdist_group("clusterx-daemon")
def test_jobs_get_disjoint_gpus_and_wait_for_free_ones(sqlite_db: str, tmp_path: Path) -> None:
    client = Client(sqlite_db, runs_dir=tmp_path / "runs")
    gate = tmp_path / "gate"
    ids = []
    for i in range(3):
        script = f'echo "$CUDA_VISIBLE_DEVICES" > {tmp_path}/gpus-{i}; while [ ! -e {gate} ]; do sleep 0.05; done'
        spec = JobSpec(
            command=["sh", "-c", script],
            env={"PATH": os.environ["PATH"]},
            backend_options={"autostart": "false"},
        )
        job_id = client.submit(spec).id
        # As a GPU machine's client stores a 2-GPU job (this machine has none, so submit would refuse it).
        client.store.apply(job_id, "test", "needs 2 GPUs", fields={"gpus": 2})
        ids.append(job_id)
    daemon = Daemon(client.store, Capacity(cpus=8, mem_mib=1 << 20, gpus=4), [0, 1, 2, 3], tick_s=0.05)
    try:
        daemon.tick()
        wait_until(lambda: (tmp_path / "gpus-0").exists() and (tmp_path / "gpus-1").exists())
        first, second = ((tmp_path / f"gpus-{i}").read_text().strip() for i in (0, 1))
        assert {first, second} == {"0,1", "2,3"}
        assert client.describe(ids[2]).state == "QUEUED"  # all four GPUs are taken
        gate.touch()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(client.describe(i).state != "SUCCEEDED" for i in ids):
            daemon.tick()
            time.sleep(0.05)
        assert [client.describe(i).state for i in ids] == ["SUCCEEDED"] * 3
        assert (tmp_path / "gpus-2").read_text().strip() in ("0,1", "2,3")
    finally:
        for tracked in list(daemon.tracked.values()):
            daemon.kill(tracked, "cancel")
