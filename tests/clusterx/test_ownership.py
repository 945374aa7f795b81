"""Ownership enforced by the daemon: it identifies the caller of every socket request by SO_PEERCRED and refuses
to cancel, retry or change another user's job. The other user is a real second Unix user, talking to the socket
directly (stdlib Python run with runuser), as anyone on the machine could."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from clusterx import Client, JobSpec
from clusterx.backends.fake import write_fake_state
from clusterx.cli import main
from clusterx.daemon.fastpath import socket_path
from clusterx.db.models import Job
from clusterx.errors import JobNotFoundError, NotOwnerError
from sqlalchemy import update

from tests.clusterx.conftest import wait_until

pytestmark = pytest.mark.xdist_group("clusterx-daemon")

# Run by the other user with the system's Python (the checkout may be a folder only we can enter).
RAW_CLIENT = """
import json, socket, sys
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
    sock.connect(sys.argv[1])
    sock.sendall(sys.argv[2].encode() + b"\\n")
    data = b""
    while not data.endswith(b"\\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
print(data.decode())
"""


def as_user(user: str, socket_file: Path, request: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        [
            "runuser",
            "-u",
            user,
            "--",
            "/usr/bin/python3",
            "-I",
            "-c",
            RAW_CLIENT,
            str(socket_file),
            json.dumps(request),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def sleeper(**fields: object) -> JobSpec:
    return JobSpec.from_mapping({"command": ["sleep", "60"], "env": {"PATH": os.environ["PATH"]}, **fields})


def test_the_daemon_refuses_another_users_requests(
    other_user: str, shared_dir: Path, stop_daemons: Callable[[str], None]
) -> None:
    db = str(shared_dir / "jobs.db")
    stop_daemons(db)
    client = Client(db, runs_dir=shared_dir / "runs")
    mine = client.submit(sleeper(name="mine")).id
    wait_until(lambda: client.describe(mine).state == "RUNNING")
    owner = client.user  # the daemon runs as this test's user (root in CI)
    socket_file = socket_path(client.url)
    refusals = [
        ({"op": "cancel", "job_ids": [mine]}, f"job {mine} belongs to {owner}; {other_user} may not cancel it"),
        ({"op": "priority", "job_id": mine, "priority": 9}, f"{other_user} may not change it"),
        ({"op": "retry", "job_id": mine}, f"this daemon runs jobs as {owner}; {other_user} may not retry jobs"),
        ({"op": "submit", "spec": {"command": ["id"]}}, f"{other_user} may not submit jobs through it"),
    ]
    for request, message in refusals:
        answer = as_user(other_user, socket_file, request)
        assert (answer["ok"], answer["kind"]) == (False, "NotOwnerError"), answer
        assert message in answer["error"]
    record = client.describe(mine)
    assert (record.state, record.priority, record.cancel_requested) == ("RUNNING", 0, False)
    assert [r.id for r in client.list(poll=False)] == [mine]  # nothing was submitted

    # The same rule lets a job's owner act on it: a job of the other user's in this history (as on a shared one).
    theirs = client.submit(sleeper(name="theirs")).id
    client.store.write(lambda s: s.execute(update(Job).where(Job.id == theirs).values(user=other_user)))
    answer = as_user(other_user, socket_file, {"op": "priority", "job_id": theirs, "priority": 5})
    assert answer["ok"] and answer["record"]["priority"] == 5
    answer = as_user(other_user, socket_file, {"op": "cancel", "job_ids": [theirs]})
    assert answer["ok"], answer
    assert client.wait(theirs, timeout_s=60).state == "CANCELLED"
    assert any(f"daemon-socket:{other_user}" == e.source for e in client.describe(theirs).events)

    # And the daemon's owner may act on any job, through the same socket (Client.cancel goes there).
    assert client.cancel([mine])[mine].value in ("RUNNING", "CANCELLED")
    assert client.wait(mine, timeout_s=60).state == "CANCELLED"


def test_the_daemon_trusts_the_kernel_not_the_callers_word(
    other_user: str, shared_dir: Path, stop_daemons: Callable[[str], None]
) -> None:
    # A client claiming to be someone else (Client(user=...), or LOGNAME for the CLI) is still the uid the kernel
    # reports: the daemon goes by that.
    db = str(shared_dir / "jobs.db")
    stop_daemons(db)
    client = Client(db, runs_dir=shared_dir / "runs", poll_interval_s=0)
    job = client.submit(sleeper(name="x")).id
    client.store.write(lambda s: s.execute(update(Job).where(Job.id == job).values(user=other_user)))
    claims_owner = Client(db, user=other_user, runs_dir=shared_dir / "runs")
    assert claims_owner.set_priority(job, 3).priority == 3  # allowed: the kernel says root, and root may
    # Without the daemon, the client applies the rule to the user it acts as: the CLI names the job's owner.
    client.cancel([job])
    client.wait(job, timeout_s=60)
    fake = client.submit(
        JobSpec(command=["true"], backend="fake", backend_options={"state_dir": str(shared_dir / "fake")})
    ).id
    result = CliRunner().invoke(main, ["--db", db, "cancel", str(fake)], env={"LOGNAME": "mallory", "USER": "mallory"})
    assert result.exit_code == 2
    assert f"job {fake} belongs to {client.user}; mallory may not cancel it" in result.output
    write_fake_state(shared_dir / "fake", client.describe(fake).backend_job_id, {"state": "FAILED"})
    assert client.describe(fake).state == "FAILED"
    with pytest.raises(NotOwnerError, match=f"job {fake} belongs to {client.user}; mallory may not retry it"):
        Client(db, user="mallory").retry(fake)


@pytest.mark.postgres
def test_a_shared_postgresql_history_keeps_each_role_to_its_own_jobs(postgres_server: str, tmp_path: Path) -> None:
    """The rule of docs/clusterx.md ("Ownership", PostgreSQL) applied as written: a role that claims to be the
    job's owner (so the client's own check passes) still cannot cancel another role's job."""
    import psycopg

    from tests.clusterx.conftest import new_postgres_database

    admin_url = new_postgres_database(postgres_server)
    Client(admin_url).close()  # the database's owner creates the tables (migrations)
    with psycopg.connect(admin_url, autocommit=True) as connection:
        for statement in DOCUMENTED_POLICY:
            connection.execute(statement)
        for role in ("alice", "bob"):
            connection.execute(f"DO $$ BEGIN CREATE ROLE {role} LOGIN IN ROLE clusterx_users; "
                               "EXCEPTION WHEN duplicate_object THEN NULL; END $$")  # fmt: skip
    as_role = admin_url.replace("postgresql://postgres@", "postgresql://{}@")
    fake = {"state_dir": str(tmp_path / "fake")}
    alice = Client(as_role.format("alice"), user="alice", runs_dir=tmp_path / "runs", poll_interval_s=0)
    job = alice.submit(JobSpec(command=["train"], backend="fake", backend_options=fake)).id
    bob_as_alice = Client(as_role.format("bob"), user="alice", runs_dir=tmp_path / "runs", poll_interval_s=0)
    assert bob_as_alice.describe(job).user == "alice"  # everyone reads every job
    with pytest.raises(JobNotFoundError, match=f"no job {job}"):
        bob_as_alice.cancel([job])
    assert alice.describe(job).state == "QUEUED" and not alice.describe(job).cancel_requested
    with psycopg.connect(as_role.format("bob"), autocommit=True) as bob:
        assert bob.execute("UPDATE jobs SET priority = 99 WHERE id = %s", (job,)).rowcount == 0  # not his to change
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):  # nor to forge
            bob.execute(
                'INSERT INTO jobs (submit_key, name, "user", submit_host, backend, state, spec, run_dir, log_paths, '
                "hosts, rank_to_host, attempt, max_retries, priority, nodes, cpus, gpus, mem_mib, cancel_requested, "
                "created_at, updated_at) VALUES ('k', 'n', 'alice', 'h', 'fake', 'QUEUED', '{}', '/r', '{}', '[]', "
                "'{}', 1, 0, 0, 1, 1, 0, 0, false, now(), now())"
            )
    assert alice.describe(job).priority == 0  # bob's UPDATE matched no row he may change
    alice.cancel([job])
    assert alice.describe(job).state == "CANCELLED"
    for client in (alice, bob_as_alice):
        client.close()


# The statements of docs/clusterx.md, "Ownership" (keep the two the same).
DOCUMENTED_POLICY = [
    "DO $$ BEGIN CREATE ROLE clusterx_users; EXCEPTION WHEN duplicate_object THEN NULL; END $$",
    "GRANT SELECT ON alembic_version TO clusterx_users",
    "GRANT SELECT, INSERT, UPDATE ON jobs, job_events, attempts TO clusterx_users",
    "GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO clusterx_users",
    "ALTER TABLE jobs ENABLE ROW LEVEL SECURITY",
    "CREATE POLICY read_all ON jobs FOR SELECT USING (true)",
    'CREATE POLICY insert_own ON jobs FOR INSERT WITH CHECK ("user" = current_user)',
    'CREATE POLICY update_own ON jobs FOR UPDATE USING ("user" = current_user)',
]
