"""A job database that goes away: the PostgreSQL server is stopped for some seconds, then started again, while 4
submitters submit through the command line and the local daemon runs jobs.

Submits during the gap wait and succeed, or fail with one `clusterx: error:` line and exit status 2 and store
nothing; none is left half-stored. Jobs running through the gap keep running and their end states are recorded
once the server is back. Counted at the end: every job stored exactly once, every job whose submit succeeded run
exactly once, and nothing else run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from clusterx import Client
from clusterx.db.reconnect import DatabaseUnavailableError, is_disconnect
from clusterx.errors import ClusterxError
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from tests.clusterx.conftest import _as_postgres_user, _ensure_postgres_bin, _free_port, wait_until

CLUSTERX = str(Path(sys.executable).parent / "clusterx")
SUBMITTERS = 4
SUBMITS_EACH = 6
GAP_S = 6.0
JOB_S = 3.0  # each job runs this long, so that some are running when the server stops
LONG_JOB_S = GAP_S + 6.0  # one job runs through the whole gap

# What every job runs: note its id and attempt at the start, sleep, note the end.
JOB = (
    "import os, sys, time\n"
    "log = sys.argv[1]\n"
    "ident = f\"{os.environ['CLUSTERX_JOB_ID']} {os.environ['CLUSTERX_ATTEMPT']}\"\n"
    "with open(log, 'a') as f: f.write(f'start {ident} {time.time()}\\n')\n"
    "time.sleep(float(sys.argv[2]))\n"
    "with open(log, 'a') as f: f.write(f'end {ident} {time.time()}\\n')\n"
)


@dataclass
class Server:
    """A PostgreSQL server of this test alone, which the test stops and starts."""

    url: str
    pg_ctl: list[str]

    def stop(self) -> None:
        # immediate: the server goes away as in a crash, breaking every open connection and transaction
        subprocess.run([*self.pg_ctl, "-m", "immediate", "-w", "stop"], check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        subprocess.run([*self.pg_ctl, "-w", "start"], check=True, capture_output=True, timeout=120)


@pytest.fixture
def server() -> Iterator[Server]:
    pg_bin = _ensure_postgres_bin()
    root = Path(tempfile.mkdtemp(prefix="clusterx-pg-gap-"))
    data, sockets = root / "data", root / "sockets"
    sockets.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        shutil.chown(sockets, "postgres", "postgres")
    subprocess.run(
        _as_postgres_user([str(pg_bin / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8"]),
        check=True,
        capture_output=True,
        timeout=120,
    )
    port = _free_port()
    options = f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100"
    pg_ctl = _as_postgres_user([str(pg_bin / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-o", options])
    found = Server(f"postgresql://postgres@127.0.0.1:{port}/postgres", pg_ctl)
    found.start()
    try:
        yield found
    finally:
        subprocess.run([*pg_ctl, "-m", "immediate", "-w", "stop"], check=False, capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Submitted:
    key: str
    returncode: int
    stdout: str
    stderr: str
    started: float
    ended: float


def _submit(env: dict[str, str], url: str, key: str, log: Path, seconds: float) -> Submitted:
    started = time.time()
    done = subprocess.run(
        [CLUSTERX, "--db", url, "submit", "--name", key, "--submit-key", key, "--json", "--",
         sys.executable, "-c", JOB, str(log), str(seconds)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    return Submitted(key, done.returncode, done.stdout, done.stderr, started, time.time())


@pytest.mark.slow
@pytest.mark.postgres
def test_submits_and_running_jobs_ride_out_a_database_restart(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop_daemons: Callable[[str], None]
) -> None:
    env = {
        **os.environ,
        "XDG_DATA_HOME": str(tmp_path / "data"),  # where the daemon's lock file, socket and log go
        "CLUSTERX_RUNS_DIR": str(tmp_path / "runs"),
        "CLUSTERX_DAEMON_CPUS": "64",  # every job fits at once: the jobs mostly sleep
        "CLUSTERX_DAEMON_IDLE_EXIT": "120",
    }
    for name in ("XDG_DATA_HOME", "CLUSTERX_RUNS_DIR", "CLUSTERX_DAEMON_CPUS"):
        monkeypatch.setenv(name, env[name])
    url = server.url
    stop_daemons(url)
    log = tmp_path / "runs.log"
    subprocess.run([CLUSTERX, "--db", url, "daemon", "start"], env=env, check=True, capture_output=True, timeout=120)
    client = Client(url, runs_dir=tmp_path / "runs")

    long_job = _submit(env, url, "long", log, LONG_JOB_S)
    assert long_job.returncode == 0, long_job.stderr
    long_id = json.loads(long_job.stdout)["id"]
    wait_until(lambda: client.describe(long_id, poll=False).state == "RUNNING", timeout_s=60)

    results: list[Submitted] = []
    lock = threading.Lock()

    def submitter(index: int) -> None:
        for k in range(SUBMITS_EACH):
            result = _submit(env, url, f"s{index}-{k}", log, JOB_S)
            with lock:
                results.append(result)
            time.sleep(0.3)

    threads = [threading.Thread(target=submitter, args=(i,)) for i in range(SUBMITTERS)]
    for thread in threads:
        thread.start()

    def short_jobs_running() -> bool:
        started = {line.split()[1] for line in log.read_text().splitlines() if line.startswith("start")}
        ended = {line.split()[1] for line in log.read_text().splitlines() if line.startswith("end")}
        return len(started - ended - {str(long_id)}) >= 2

    wait_until(lambda: len(results) >= SUBMITTERS and short_jobs_running(), timeout_s=120)
    stopped_at = time.time()
    server.stop()
    time.sleep(GAP_S)
    server.start()
    back_at = time.time()
    for thread in threads:
        thread.join(timeout=600)
    assert not any(thread.is_alive() for thread in threads)

    # Some submits were under way while the server was away (they began before it came back, ended after it left).
    assert any(r.started < back_at and r.ended > stopped_at for r in results), [(r.started, r.ended) for r in results]
    succeeded = [r for r in results if r.returncode == 0]
    for r in results:
        assert "Traceback" not in r.stderr, r.stderr
        if r.returncode != 0:  # failed: exactly one error line, the user-error status
            errors = [line for line in r.stderr.splitlines() if line.startswith("clusterx: error:")]
            assert r.returncode == 2 and len(errors) == 1, r.stderr
    # With the default wait (CLUSTERX_DB_WAIT_S, 120 s) far longer than the gap, every submit waited and succeeded.
    assert len(succeeded) == len(results) == SUBMITTERS * SUBMITS_EACH, [r.stderr for r in results if r.returncode]
    ids = {r.key: json.loads(r.stdout)["id"] for r in succeeded}

    def every_job_ended() -> bool:
        return all(j.state not in ("PENDING", "QUEUED", "STARTING", "RUNNING") for j in client.list(limit=None))

    wait_until(every_job_ended, timeout_s=180, interval_s=0.5)
    jobs = client.list(limit=None)
    keys = Counter(j.submit_key for j in jobs)
    assert all(n == 1 for n in keys.values())  # every job stored once
    stored = {j.submit_key: j for j in jobs}
    failed_keys = {r.key for r in results if r.returncode != 0}
    assert not failed_keys & set(stored), "a submit that failed left its job stored"
    assert set(stored) == {"long", *ids}  # nothing half-stored: every stored job is one whose submit succeeded
    assert {key: stored[key].id for key in ids} == ids
    assert all(j.state == "SUCCEEDED" for j in jobs), [(j.id, j.state, j.failure_reason) for j in jobs]

    lines = [line.split() for line in log.read_text().splitlines()]
    starts = Counter(int(job_id) for what, job_id, _attempt, _t in lines if what == "start")
    ends = Counter(int(job_id) for what, job_id, _attempt, _t in lines if what == "end")
    assert starts == Counter({j.id: 1 for j in jobs})  # every job run exactly once, and nothing else
    assert ends == starts

    # The long job ran through the whole gap, and its end (after the gap) was recorded once the server was back.
    long_record = client.describe(long_id, poll=False)
    assert long_record.started_at is not None and long_record.started_at.timestamp() < stopped_at
    assert long_record.ended_at is not None and long_record.ended_at.timestamp() > back_at
    assert [a.state for a in long_record.attempts or []] == ["SUCCEEDED"]
    # At least one other job was running when the server stopped, too.
    start_times = {int(job_id): float(t) for what, job_id, _a, t in lines if what == "start"}
    end_times = {int(job_id): float(t) for what, job_id, _a, t in lines if what == "end"}
    through = [i for i in start_times if i != long_id and start_times[i] < stopped_at < end_times[i]]
    assert through, "no short job was running when the server stopped"
    assert all(stored_job.ended_at is not None for stored_job in jobs)


@pytest.mark.postgres
def test_a_database_that_stays_away_gives_one_clear_error(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLUSTERX_DB_WAIT_S", "3")
    client = Client(server.url, runs_dir=tmp_path / "runs")  # opened while the server is up
    assert client.list(limit=None) == []
    server.stop()
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailableError, match="could not be reached for 3 s") as caught:
        client.list(limit=None)
    assert time.monotonic() - started >= 3.0  # it waited for the server first
    assert isinstance(caught.value, ClusterxError)  # the command line's one error line, exit status 2
    client.close()
    # A command started while the server is down cannot tell a restart from a wrong URL: one line at once.
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}
    done = subprocess.run(
        [CLUSTERX, "--db", server.url, "list"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("clusterx: error:")]
    assert len(errors) == 1 and "cannot open the job database" in errors[0], done.stderr


@pytest.mark.postgres
def test_a_broken_connection_is_told_from_other_database_errors(server: Server) -> None:
    engine = create_engine(server.url)
    with pytest.raises(DBAPIError) as not_a_table, engine.connect() as connection:
        connection.execute(text("SELECT * FROM no_such_table"))
    assert not is_disconnect(not_a_table.value)
    server.stop()
    with pytest.raises(DBAPIError) as broken, engine.connect() as connection:  # the pooled connection, now broken
        connection.execute(text("SELECT 1"))
    assert is_disconnect(broken.value)
    with pytest.raises(DBAPIError) as refused, engine.connect():  # a new one: refused
        pass
    assert is_disconnect(refused.value)
    engine.dispose()
