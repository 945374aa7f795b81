"""The Slurm backend against a REAL one-node Slurm (started by conftest.slurm_cluster).

Every test here submits real jobs with sbatch and reads them back through squeue, the job-completion log
(`sacct -c`; the test cluster has no slurmdbd, like many real ones) or the scripts' exit-code files.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from clusterx.backends.base import SubmitRequest
from clusterx.errors import BackendError
from clusterx.jobenv import CLUSTERX_VARIABLES
from clusterx.spec import JobSpec, env_from_shell
from clusterx.states import JobState

from tests.clusterx.slurm.conftest import SlurmCluster, free_port, wait_for_status

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm")]

HOSTILE_ARGS = ["it's", '"dq"', "$(touch pwned)", "`id`", "a b", "line\nbreak", "; exit 9", "$HOME", "*", ""]
_job_ids = itertools.count(1000)


def request_for(tmp_path: Path, command: Sequence[str], **fields: object) -> SubmitRequest:
    job_id = next(_job_ids)
    defaults: dict[str, object] = {
        "env": {**env_from_shell(os.environ), "OMP_NUM_THREADS": "1"},
        "mem_per_node": "200M",
        "run_dir": str(tmp_path / f"run-{job_id}"),
        "backend": "slurm",
    }
    spec = JobSpec.model_validate({**defaults, **fields, "command": list(command)})
    return SubmitRequest(
        job_id=job_id, attempt=1, spec_json=spec.model_dump_json(), log_dir=tmp_path / f"logs-{job_id}"
    )


def is_running(status: object) -> bool:
    return getattr(status, "state", None) is JobState.RUNNING


def is_terminal(status: object) -> bool:
    state = getattr(status, "state", None)
    return isinstance(state, JobState) and state.is_terminal


@pytest.fixture(scope="module")
def time_limit_job(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A job with a 1-minute limit whose end time is moved to now once it runs.

    Slurm counts limits in minutes and checks them every 30 s, so an honest time-out costs 60-90 s. Moving
    the job's EndTime (`scontrol update EndTime=now`) keeps the kill Slurm's own: slurmctld's time-limit check
    ends the job with TIMEOUT (SIGTERM, then SIGKILL after KillWait) within 30 s. Submitted by the first test
    and checked by the last, so that wait overlaps the other tests.
    """
    backend = slurm_cluster.backend()
    request = request_for(tmp_path_factory.mktemp("timeout"), ["sleep", "300"], time_limit="1m")
    job_id = backend.submit(request)
    wait_for_status(backend, job_id, is_running)
    # The end time moves only once the job's step runs: moved before the script's srun has created it, Slurm ends
    # the job while srun starts ("Unable to create step"), which is a failure, not a time-out.
    deadline = time.monotonic() + 60
    while f"{job_id}.0" not in slurm_cluster.run("squeue", "--steps", "--noheader", "--format=%i").stdout.split():
        assert time.monotonic() < deadline, "the time-limit job's step never started"
        time.sleep(0.3)
    # Slurm refuses an end time that is not after the job's start time (whole seconds, and the start it records
    # can trail the moment squeue first says RUNNING): ask again with a fresh "now" until it is accepted.
    deadline = time.monotonic() + 30
    while True:
        time.sleep(1.5)
        now = time.strftime("%Y-%m-%dT%H:%M:%S")
        updated = slurm_cluster.run("scontrol", "update", f"JobId={job_id}", f"EndTime={now}")
        if updated.returncode == 0 or time.monotonic() > deadline:
            break
    assert updated.returncode == 0, updated.stderr
    yield job_id
    backend.cancel(job_id)


def test_time_limit_job_runs(slurm_cluster: SlurmCluster, time_limit_job: str) -> None:
    status = slurm_cluster.backend().poll([time_limit_job])[time_limit_job]
    assert status.state in (JobState.RUNNING, JobState.TIMEOUT)


def test_a_job_that_succeeds(slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERX_TEST_SUBMIT_SHELL_ONLY", "leaked")  # in sbatch's environment, not the spec's
    workdir = tmp_path / 'work dir it\'s "q" $x'
    workdir.mkdir()
    job = (
        'printf "%s\\0" "$@" >"$CLUSTERX_RUN_DIR/args"; env -0 >"$CLUSTERX_RUN_DIR/env"; pwd >"$CLUSTERX_RUN_DIR/pwd"; '
        "echo hello from slurm; echo to stderr >&2"
    )
    request = request_for(
        tmp_path, ["/bin/bash", "-c", job, "argv0", *HOSTILE_ARGS], name="ok $(id)", workdir=str(workdir)
    )
    backend = slurm_cluster.backend()
    job_id = backend.submit(request)
    assert job_id.isdigit()
    assert (request.log_dir / "sbatch.sh").read_text() == backend.dryrun(request)  # dryrun = what was sent

    status = wait_for_status(backend, job_id, is_terminal)
    assert (status.state, status.exit_code, status.raw_state) == (JobState.SUCCEEDED, 0, "COMPLETED")
    assert status.hosts == (slurm_cluster.node,)
    assert status.rank_to_host == {0: slurm_cluster.node}
    assert status.started_at is not None
    assert status.ended_at is not None
    # Once squeue forgets the job (MinJobAge=2), the completion log answers, even for a working directory whose
    # spaces and quotes trouble `sacct -c`'s parser.
    deadline = time.monotonic() + 30
    while backend.commands.squeue([job_id], None) and time.monotonic() < deadline:
        time.sleep(0.5)
    from_log = backend.accounting_records([job_id], None)[job_id]
    assert (from_log.raw_state, from_log.exit_code, from_log.nodelist) == ("COMPLETED", "0:0", slurm_cluster.node)
    assert backend.poll([job_id])[job_id].state is JobState.SUCCEEDED
    logs = backend.log_paths(request)
    assert logs["stdout"].read_text() == "hello from slurm\n"
    assert logs["stderr"].read_text() == "to stderr\n"

    run_dir = Path(JobSpec.model_validate_json(request.spec_json).run_dir or "")
    assert (run_dir / "args").read_bytes().split(b"\0")[:-1] == [arg.encode() for arg in HOSTILE_ARGS]
    assert (run_dir / "pwd").read_text().strip() == str(workdir)
    assert not (workdir / "pwned").exists()
    env = dict(item.split("=", 1) for item in (run_dir / "env").read_text().split("\0") if item)
    assert "CLUSTERX_TEST_SUBMIT_SHELL_ONLY" not in env
    assert (env["CLUSTERX_JOB_ID"], env["CLUSTERX_ATTEMPT"], env["CLUSTERX_RUN_DIR"]) == (
        str(request.job_id),
        "1",
        str(run_dir),
    )
    assert sorted(k for k in env if k.startswith("CLUSTERX_")) == sorted(CLUSTERX_VARIABLES)  # as on local
    assert env["CLUSTERX_BACKEND"] == "slurm"
    # Nothing but the spec's variables and those Slurm, bash and clusterx set themselves.
    spec_env = JobSpec.model_validate_json(request.spec_json).env
    own = {"PWD", "SHLVL", "_", "OLDPWD", "TMPDIR", "SRUN_DEBUG", "MASTER_ADDR", "MASTER_PORT"}
    extra = {k for k in env if k not in spec_env and k not in own and not k.startswith(("SLURM", "CLUSTERX_"))}
    assert not extra, f"variables the job should not see: {sorted(extra)}"


def test_a_job_that_fails_with_exit_3(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    backend = slurm_cluster.backend()
    job_id = backend.submit(request_for(tmp_path, ["/bin/sh", "-c", "exit 3"]))
    status = wait_for_status(backend, job_id, is_terminal)
    assert (status.state, status.exit_code, status.raw_state) == (JobState.FAILED, 3, "FAILED")
    assert status.reason == "exited with status 3"


def test_cancel_is_idempotent(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    backend = slurm_cluster.backend()
    job_id = backend.submit(request_for(tmp_path, ["sleep", "300"]))
    wait_for_status(backend, job_id, is_running)
    backend.cancel(job_id)
    status = wait_for_status(backend, job_id, is_terminal)
    assert status.state is JobState.CANCELLED
    assert status.raw_state.startswith("CANCELLED")
    assert status.exit_code is None  # Slurm's 0:0 for a cancelled job is not an exit status
    backend.cancel(job_id)  # already finished: not an error
    backend.cancel("987654321")  # never existed: not an error


def test_many_jobs_are_polled_with_a_fixed_number_of_commands(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    backend = slurm_cluster.backend()
    exits = [0, 1, 2, 0, 5, 0]
    ids = [backend.submit(request_for(tmp_path, ["/bin/sh", "-c", f"exit {code}"])) for code in exits]
    live = backend.submit(request_for(tmp_path, ["sleep", "300"]))
    deadline = time.monotonic() + 60
    while not all(is_terminal(s) for s in backend.poll(ids).values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    wait_for_status(backend, live, is_running)

    commands: list[list[str]] = []
    backend = slurm_cluster.backend()  # a fresh one: it has not yet learned that this cluster has no slurmdbd
    real_run = backend.commands.run

    def counting_run(name: str, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        commands.append([name, *args])
        return real_run(name, args)

    backend.commands.run = counting_run  # type: ignore[method-assign]  # a spy: it still runs the real command
    statuses = backend.poll([*ids, live, "987654"])
    assert [statuses[i].exit_code for i in ids] == exits
    assert [statuses[i].state for i in ids] == [JobState.SUCCEEDED if c == 0 else JobState.FAILED for c in exits]
    assert statuses[live].state is JobState.RUNNING
    assert statuses["987654"].state is JobState.LOST
    # One squeue for all, one sacct (learns there is no slurmdbd), one sacct -c for all the finished ones.
    assert [c[0] for c in commands] == ["squeue", "sacct", "sacct"], commands
    commands.clear()
    backend.poll([*ids, live])
    assert [c[0] for c in commands] == ["squeue", "sacct"]  # no slurmdbd is remembered
    assert "-c" in commands[1]
    backend.cancel(live)


def test_without_any_accounting_the_exit_code_files_tell(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    backend = slurm_cluster.backend(accounting="none")
    ok = backend.submit(request_for(tmp_path, ["true"]))
    failed = backend.submit(request_for(tmp_path, ["/bin/sh", "-c", "exit 4"]))
    cancelled = backend.submit(request_for(tmp_path, ["sleep", "300"]))
    wait_for_status(backend, cancelled, is_running)
    # Cancel once the script has begun (its first act is to write its file); a job cancelled before its
    # script ran a line leaves no file and is LOST, as test_a_job_known_nowhere_is_lost shows.
    deadline = time.monotonic() + 30
    while not (slurm_cluster.status_dir / f"{cancelled}.status").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    backend.cancel(cancelled)
    ids = [ok, failed, cancelled]
    # Wait until squeue has forgotten them all (MinJobAge=2): only the files are left to tell.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        statuses = backend.poll(ids)
        if all(s.raw_state.startswith("EXIT_FILE") for s in statuses.values()):
            break
        time.sleep(0.5)
    assert (statuses[ok].state, statuses[ok].exit_code) == (JobState.SUCCEEDED, 0)
    assert (statuses[failed].state, statuses[failed].exit_code) == (JobState.FAILED, 4)
    assert statuses[cancelled].state is JobState.CANCELLED
    assert statuses[cancelled].raw_state == "EXIT_FILE slurm=COMPLETING|None"  # what the script saw
    assert statuses[ok].hosts == (slurm_cluster.node,)


def test_a_job_known_nowhere_is_lost(slurm_cluster: SlurmCluster) -> None:
    status = slurm_cluster.backend().poll(["987650"])["987650"]
    assert status.state is JobState.LOST
    assert status.reason is not None
    assert "no longer knows" in status.reason


def test_sbatch_refusal_is_one_clear_error(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    with pytest.raises(BackendError, match=r"sbatch refused the job: .*partition"):
        slurm_cluster.backend().submit(request_for(tmp_path, ["true"], partition="no-such-partition"))


def test_srun_launcher_runs_one_task_per_process(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job = 'echo "$SLURM_PROCID $SLURM_NTASKS $MASTER_ADDR" >"$CLUSTERX_RUN_DIR/task-$SLURM_PROCID"'
    request = request_for(tmp_path, ["/bin/sh", "-c", job], procs_per_node=2, cpus_per_node=2)
    backend = slurm_cluster.backend()
    job_id = backend.submit(request)
    status = wait_for_status(backend, job_id, is_terminal)
    assert status.state is JobState.SUCCEEDED, backend.log_paths(request)["stderr"].read_text()
    assert status.rank_to_host == {0: slurm_cluster.node, 1: slurm_cluster.node}
    run_dir = Path(JobSpec.model_validate_json(request.spec_json).run_dir or "")
    for rank in (0, 1):
        assert (run_dir / f"task-{rank}").read_text() == f"{rank} 2 {slurm_cluster.node}\n"


def test_an_unreachable_controller_is_an_error_not_a_lost_job(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    dead_port = free_port()
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        re.sub(r"^SlurmctldPort=\d+$", f"SlurmctldPort={dead_port}", slurm_cluster.conf.read_text(), flags=re.M)
    )
    # Slurm's clients retry a refused connection for about 15 s; the backend's own limit stops them sooner.
    backend = slurm_cluster.backend(slurm_conf=str(conf), command_timeout="3")
    with pytest.raises(BackendError, match=r"squeue (failed|did not answer within 3 s \(is slurmctld up\?\))"):
        backend.poll(["1"])


def test_time_limit_ends_in_timeout(slurm_cluster: SlurmCluster, time_limit_job: str) -> None:
    backend = slurm_cluster.backend()
    status = wait_for_status(backend, time_limit_job, is_terminal, timeout=90)
    assert status.state is JobState.TIMEOUT
    assert status.raw_state == "TIMEOUT"
    assert status.reason == "killed at its time limit"
    # The exit-code file alone tells the same: the script saw Slurm ending it for its time limit.
    deadline = time.monotonic() + 30
    while (from_file := slurm_cluster.backend(accounting="none").poll([time_limit_job])[time_limit_job]).raw_state in (
        "TIMEOUT",
        "COMPLETING",
    ) and time.monotonic() < deadline:
        time.sleep(0.5)  # squeue still lists it for MinJobAge seconds
    assert from_file.state is JobState.TIMEOUT, from_file
    assert from_file.raw_state == "EXIT_FILE slurm=COMPLETING|TimeLimit"
