"""8 processes submit 500 jobs in total, at the same time, to one fresh database (SQLite, and PostgreSQL):
none lost, none duplicated, and a repeated submit with the same key returns the same job."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from clusterx import Client

PROCESSES = 8
TOTAL_JOBS = 500
REPEATS_PER_PROCESS = 5

SUBMITTER = textwrap.dedent(
    """
    import json, sys, time
    from clusterx import Client, JobSpec

    db, fake_dir, runs, index, count, repeats, start_at = sys.argv[1:8]
    index, count, repeats = int(index), int(count), int(repeats)
    while time.time() < float(start_at):  # all processes begin together, on a database none has created yet
        time.sleep(0.001)
    client = Client(db, runs_dir=runs)
    ids = {}
    for k in range(count):
        key = f"p{index}-j{k}"
        spec = JobSpec(command=["true"], backend="fake", backend_options={"state_dir": fake_dir}, submit_key=key)
        ids[key] = client.submit(spec).id
    for k in range(repeats):  # the same submit again, as a client retrying after a lost reply would
        key = f"p{index}-j{k}"
        spec = JobSpec(command=["true"], backend="fake", backend_options={"state_dir": fake_dir}, submit_key=key)
        assert client.submit(spec).id == ids[key], key
    print(json.dumps(ids))
    """
)


@pytest.mark.slow
def test_concurrent_submitters_lose_and_duplicate_nothing(db_url: str, tmp_path: Path) -> None:
    counts = [TOTAL_JOBS // PROCESSES + (1 if i < TOTAL_JOBS % PROCESSES else 0) for i in range(PROCESSES)]
    start_at = time.time() + 3.0
    fake_dir, runs = tmp_path / "fake", tmp_path / "runs"
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                SUBMITTER,
                db_url,
                str(fake_dir),
                str(runs),
                str(i),
                str(n),
                str(REPEATS_PER_PROCESS),
                str(start_at),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, n in enumerate(counts)
    ]
    reported: dict[str, int] = {}
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
        reported.update(json.loads(out))
    client = Client(db_url, runs_dir=runs)
    jobs = client.list(limit=None, poll=False)
    assert len(jobs) == TOTAL_JOBS
    assert len({j.submit_key for j in jobs}) == TOTAL_JOBS
    assert {j.submit_key: j.id for j in jobs} == reported
    assert all(j.state == "QUEUED" for j in jobs)
    assert len(list(fake_dir.glob("*.json"))) == TOTAL_JOBS  # each job reached the backend exactly once
