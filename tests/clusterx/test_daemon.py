"""The local backend's daemon, for real: processes, signals, time limits, retries, cancellation, scheduling order,
and surviving kill -9 of itself while jobs run."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from clusterx import Client, JobSpec
from clusterx.daemon.control import daemon_pid, start_daemon, stop_daemon
from clusterx.daemon.fastpath import socket_path
from clusterx.jobenv import CLUSTERX_VARIABLES
from clusterx.record import JobRecord

from tests.clusterx.conftest import wait_until

pytestmark = pytest.mark.xdist_group("clusterx-daemon")  # they share two CPU cores and time limits


@pytest.fixture
def client(sqlite_db: str, tmp_path: Path, stop_daemons: Callable[[str], None]) -> Client:
    stop_daemons(sqlite_db)
    return Client(sqlite_db, runs_dir=tmp_path / "runs")


def sh(script: str, **fields: object) -> JobSpec:
    return JobSpec.from_mapping({"command": ["sh", "-c", script], "env": {"PATH": os.environ["PATH"]}, **fields})


def test_job_gets_its_environment_and_log_files(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEAK_CHECK", "daemon-and-submitter-have-it")
    record = client.submit(
        sh('env > "$CLUSTERX_RUN_DIR/env.txt"; echo to-stdout; echo to-stderr >&2', procs_per_node=2, env={"A": "1"})
    )
    done = client.wait(record.id, timeout_s=60)
    assert done.state == "SUCCEEDED" and done.exit_code == 0
    env = dict(line.split("=", 1) for line in Path(done.run_dir, "env.txt").read_text().splitlines())
    assert env["A"] == "1" and "LEAK_CHECK" not in env  # the spec's environment, not the daemon's
    assert env["PATH"] == os.defpath  # the spec gave none
    assert env["CLUSTERX_JOB_ID"] == str(record.id) and env["CLUSTERX_ATTEMPT"] == "1"
    assert env["CLUSTERX_RUN_DIR"] == done.run_dir
    # The same CLUSTERX_* variables as on every backend (clusterx.jobenv), with this job's values.
    assert sorted(k for k in env if k.startswith("CLUSTERX_")) == sorted(CLUSTERX_VARIABLES)
    assert (env["CLUSTERX_BACKEND"], env["CLUSTERX_NODES"], env["CLUSTERX_PROCS_PER_NODE"]) == ("local", "1", "2")
    assert (env["MASTER_ADDR"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["NODE_RANK"]) == (
        "127.0.0.1",
        "2",
        "2",
        "0",
    )
    assert 1024 <= int(env["MASTER_PORT"]) <= 65535
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # no GPU asked for: none visible
    assert Path(done.log_paths["stdout"]).read_text() == "to-stdout\n"
    assert Path(done.log_paths["stderr"]).read_text() == "to-stderr\n"
    assert done.hosts and done.rank_to_host == {"0": done.hosts[0], "1": done.hosts[0]}


def test_exit_status_is_recorded(client: Client) -> None:
    done = client.wait(client.submit(sh("exit 3", env={})).id, timeout_s=60)
    assert (done.state, done.exit_code, done.failure_reason) == ("FAILED", 3, "exited with status 3")


def test_killed_job_fails_with_the_signal_named(client: Client, tmp_path: Path) -> None:
    pid_file = tmp_path / "job.pid"
    record = client.submit(sh(f"echo $$ > {pid_file}; sleep 60"))
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    done = client.wait(record.id, timeout_s=60)
    assert done.state == "FAILED"
    assert done.failure_reason == "killed by signal 9 (SIGKILL)"
    assert done.exit_code == 137


def test_time_limit_kills_the_whole_process_group(client: Client, tmp_path: Path) -> None:
    child_pid = tmp_path / "child.pid"
    record = client.submit(sh(f"sleep 300 & echo $! > {child_pid}; wait", time_limit=2))
    done = client.wait(record.id, timeout_s=60)
    assert done.state == "TIMEOUT" and "time limit of 2 s" in done.failure_reason
    wait_until(lambda: not psutil.pid_exists(int(child_pid.read_text())) or _zombie(int(child_pid.read_text())))


def test_retries_record_each_attempt_and_tell_the_job(client: Client) -> None:
    script = 'echo "$CLUSTERX_ATTEMPT" >> "$CLUSTERX_RUN_DIR/attempts.txt"; test "$CLUSTERX_ATTEMPT" -ge 3'
    done = client.wait(client.submit(sh(script, max_retries=3)).id, timeout_s=60)
    assert (done.state, done.attempt) == ("SUCCEEDED", 3)
    assert Path(done.run_dir, "attempts.txt").read_text().split() == ["1", "2", "3"]
    assert [(a.attempt, a.state, a.exit_code) for a in done.attempts] == [
        (1, "FAILED", 1),
        (2, "FAILED", 1),
        (3, "SUCCEEDED", 0),
    ]
    states = [e.to_state for e in done.events]
    assert states.count("RUNNING") == 3 and states[-1] == "SUCCEEDED"
    assert states.index("SUCCEEDED") == len(states) - 1  # live between attempts; only the last end is final


def test_cancel_running_job(client: Client, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    record = client.submit(sh(f"touch {marker}; sleep 300"))
    wait_until(marker.exists)
    client.cancel([record.id])
    done = client.wait(record.id, timeout_s=60)
    assert done.state == "CANCELLED"
    pid = done.attempts[0].pid
    wait_until(lambda: not psutil.pid_exists(pid) or _zombie(pid))


def test_priority_then_submission_order(client: Client, sqlite_db: str, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    blocker = client.submit(sh(f"while [ ! -e {gate} ]; do sleep 0.05; done", cpus_per_node=2))
    wait_until(lambda: client.describe(blocker.id).state == "RUNNING")
    order_file = tmp_path / "order"
    ids = {}
    for name, priority in [("low-1", 0), ("high", 10), ("low-2", 0)]:
        ids[name] = client.submit(sh(f"echo {name} >> {order_file}", name=name, priority=priority, cpus_per_node=2)).id
    gate.touch()
    for job_id in ids.values():
        assert client.wait(job_id, timeout_s=60).state == "SUCCEEDED"
    assert order_file.read_text().split() == ["high", "low-1", "low-2"]


def test_a_wide_job_starts_when_it_should_behind_a_stream_of_narrow_ones(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EASY backfill in the real daemon: two cores, one held by a job with a 4 s limit that ends after 2 s. A
    2-core job waits for it; a stream of 1-core jobs (20 s limits) arrives meanwhile and would each take the free
    core (starving the wide job for as long as the stream lasts); a short job (1 s limit) may backfill."""
    monkeypatch.setenv("CLUSTERX_DAEMON_CPUS", "2")
    holder = client.submit(sh("sleep 2", name="holder", time_limit=4))
    wait_until(lambda: client.describe(holder.id).state == "RUNNING")
    wide = client.submit(sh("sleep 0.5", name="wide", cpus_per_node=2, time_limit=10))
    short = client.submit(sh("true", name="short", time_limit=1))
    stream = []
    for i in range(4):
        stream.append(client.submit(sh("sleep 0.5", name=f"narrow-{i}", time_limit=20)))
        time.sleep(0.3)
    assert client.wait(wide.id, timeout_s=60).state == "SUCCEEDED"
    for job in stream:
        assert client.wait(job.id, timeout_s=60).state == "SUCCEEDED"
    started = {r.name: _started(r) for r in (client.describe(j.id) for j in (holder, wide, short, *stream))}
    held_until = _ended(client.describe(holder.id))
    assert started["short"] < held_until  # backfilled: it ended before the wide job's reservation
    assert started["wide"] >= held_until - 0.5  # it needed both cores
    assert started["wide"] - held_until < 2.0  # and took them as soon as the holder ended (a few passes)
    assert all(started[f"narrow-{i}"] >= started["wide"] for i in range(4))  # none overtook it


def _started(record: JobRecord) -> float:
    assert record.started_at is not None
    return record.started_at.timestamp()


def _ended(record: JobRecord) -> float:
    assert record.ended_at is not None
    return record.ended_at.timestamp()


def test_start_daemon_returns_once_the_socket_listens(client: Client) -> None:
    # The cause of a flaky fast-path submit: the pid (what start_daemon waits for) was written before the socket
    # was bound, so a submit right after `daemon start` could find no socket and fall back.
    start_daemon(client.url)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(socket_path(client.url)))  # at once: no waiting, no retry


def test_one_daemon_per_database(client: Client, sqlite_db: str) -> None:
    url = client.url
    first = start_daemon(url)
    assert start_daemon(url) == first == daemon_pid(url)
    assert stop_daemon(url) == first
    assert daemon_pid(url) is None
    assert stop_daemon(url) is None


@pytest.mark.slow
def test_daemon_killed_and_restarted_accounts_for_every_job(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLUSTERX_DAEMON_CPUS", "8")  # these jobs mostly sleep
    url = client.url
    go = tmp_path / "go"
    ends_ok = client.submit(sh(f"while [ ! -e {go} ]; do sleep 0.05; done; exit 0", name="ends-ok"))
    ends_bad = client.submit(sh(f"while [ ! -e {go} ]; do sleep 0.05; done; exit 5", name="ends-bad"))
    survives = client.submit(sh(f"while [ ! -e {go}2 ]; do sleep 0.05; done; exit 0", name="survives"))
    vanishes = client.submit(sh("sleep 300", name="vanishes"))
    jobs = [ends_ok, ends_bad, survives, vanishes]
    wait_until(lambda: all(client.describe(j.id).state == "RUNNING" for j in jobs))
    old_daemon = daemon_pid(url)
    assert old_daemon is not None
    os.kill(old_daemon, signal.SIGKILL)
    wait_until(lambda: daemon_pid(url) is None)
    queued_meanwhile = client.store  # the database still works without the daemon
    assert queued_meanwhile.get(ends_ok.id).state == "RUNNING"
    go.touch()  # two jobs end while no daemon watches
    for job in (ends_ok, ends_bad):
        exit_file = Path(client.describe(job.id).attempts[0].log_dir) / "exit.json"
        wait_until(exit_file.exists)
    vanished_pid = client.describe(vanishes.id).attempts[0].pid
    os.killpg(vanished_pid, signal.SIGKILL)  # job and its wrapper die without a trace
    wait_until(lambda: not psutil.pid_exists(vanished_pid) or _zombie(vanished_pid))

    new_daemon = start_daemon(url)
    assert new_daemon != old_daemon
    assert client.wait(ends_ok.id, timeout_s=30).state == "SUCCEEDED"
    bad = client.wait(ends_bad.id, timeout_s=30)
    assert (bad.state, bad.exit_code) == ("FAILED", 5)
    lost = client.wait(vanishes.id, timeout_s=30)
    assert lost.state == "LOST" and "left no exit status" in lost.failure_reason
    adopted = client.describe(survives.id)
    assert adopted.state == "RUNNING"
    assert any("adopted" in e.message for e in adopted.events)
    Path(f"{go}2").touch()
    assert client.wait(survives.id, timeout_s=30).state == "SUCCEEDED"


def _zombie(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def test_cancel_recorded_while_the_daemon_was_down_is_carried_out(client: Client, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    record = client.submit(sh(f"touch {marker}; sleep 300"))
    wait_until(marker.exists)
    wait_until(lambda: client.describe(record.id).state == "RUNNING")
    url = client.url
    old = daemon_pid(url)
    assert old is not None
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: daemon_pid(url) is None)
    client.store.request_cancel(record.id, "test")  # as a cancel that reached only the database
    start_daemon(url)
    done = client.wait(record.id, timeout_s=60)
    assert done.state == "CANCELLED"
    pid = done.attempts[0].pid
    wait_until(lambda: not psutil.pid_exists(pid) or _zombie(pid))


def test_missing_program_fails_with_a_reason(client: Client) -> None:
    done = client.wait(client.submit(JobSpec(command=["no-such-program-xyz"], env={})).id, timeout_s=60)
    assert (done.state, done.exit_code) == ("FAILED", 127)
    assert "cannot run 'no-such-program-xyz'" in done.failure_reason


@pytest.mark.postgres
def test_local_job_with_a_postgresql_history(
    postgres_server: str, tmp_path: Path, stop_daemons: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.clusterx.conftest import new_postgres_database

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # where the daemon's lock file goes
    url = new_postgres_database(postgres_server)
    stop_daemons(url)
    client = Client(url, runs_dir=tmp_path / "runs")
    done = client.wait(client.submit(sh("exit 7")).id, timeout_s=60)
    assert (done.state, done.exit_code) == ("FAILED", 7)
    assert list((tmp_path / "data" / "clusterx").glob("daemon-*.lock"))
