"""The command line, end to end on the local backend: submit (command or spec file, environment allow-list,
secrets refused, dry run), list, describe --json, logs (--grep, --rank, --follow), cancel (ids, filters with
confirmation), wait's exit status, retry, daemon start/stop/status, and a --help that stays light."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from clusterx.cli import main

pytestmark = pytest.mark.xdist_group("clusterx-daemon")


@pytest.fixture
def cli(sqlite_db: str, tmp_path: Path, stop_daemons: Callable[[str], None]) -> Callable[..., Result]:
    stop_daemons(sqlite_db)
    runner = CliRunner()
    base_env = {"CLUSTERX_DB": sqlite_db, "CLUSTERX_RUNS_DIR": str(tmp_path / "runs")}

    def invoke(*args: str, env: dict[str, str] | None = None, input: str | None = None) -> Result:
        return runner.invoke(main, list(args), env={**base_env, **(env or {})}, input=input, catch_exceptions=False)

    return invoke


def _submit(cli: Callable[..., Result], *args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    result = cli("submit", "--json", *args, env=env)
    assert result.exit_code == 0, result.output
    record: dict[str, object] = json.loads(result.output)
    return record


def test_help_loads_neither_sqlalchemy_nor_pydantic() -> None:
    code = (
        "import sys\nfrom clusterx.cli import main\n"
        "try:\n    main(['submit', '--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('sqlalchemy', 'pydantic', 'alembic', 'psutil') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, capture_output=True)


def test_submit_wait_describe_logs(cli: Callable[..., Result], tmp_path: Path) -> None:
    script = "echo hello; echo warn >&2; echo rank0 > $CLUSTERX_RUN_DIR/logs/rank-0.log; env > $CLUSTERX_RUN_DIR/env"
    run_dir = tmp_path / "myrun"
    (run_dir / "logs").mkdir(parents=True)
    env = {"NOT_ALLOWED": "x", "LC_TIME": "C"}
    record = _submit(cli, "--name", "demo", "--env", "FOO=bar", "--run-dir", str(run_dir), "--", "sh", "-c", script,
                     env=env)  # fmt: skip
    assert record["name"] == "demo" and record["state"] == "QUEUED"
    job_id = str(record["id"])
    waited = cli("wait", job_id)
    assert waited.exit_code == 0 and "SUCCEEDED" in waited.output
    described = json.loads(cli("describe", job_id, "--json").output)
    assert described["run_dir"] == str(run_dir) and described["hosts"] and described["log_paths"]["stdout"]
    job_env = dict(line.split("=", 1) for line in (run_dir / "env").read_text().splitlines())
    assert job_env["FOO"] == "bar" and job_env["LC_TIME"] == "C" and job_env["PATH"] == os.environ["PATH"]
    assert "NOT_ALLOWED" not in job_env
    assert cli("logs", job_id).output == "hello\n"
    assert cli("logs", job_id, "--stderr").output == "warn\n"
    assert cli("logs", job_id, "--rank", "0").output == "rank0\n"
    assert cli("logs", job_id, "--grep", "^h").output == "hello\n"
    assert cli("logs", job_id, "--follow").output == "hello\n"  # the job has ended: prints all, returns
    listed = json.loads(cli("list", "--json", "--state", "succeeded", "--name", "dem").output)
    assert [r["id"] for r in listed] == [record["id"]]
    assert "demo" in cli("list").output
    assert "RUNNING → SUCCEEDED" in cli("describe", job_id).output


def test_follow_prints_output_as_it_comes(cli: Callable[..., Result]) -> None:
    record = _submit(cli, "--", "sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.3; done")
    result = cli("logs", str(record["id"]), "--follow")
    assert result.output == "line1\nline2\nline3\n"


def test_spec_file_and_overrides(cli: Callable[..., Result], tmp_path: Path) -> None:
    spec = tmp_path / "job.toml"
    spec.write_text('name = "from-file"\ncommand = ["sh", "-c", "exit 4"]\npriority = 1\n')
    record = _submit(cli, "--priority", "7", str(spec))
    assert (record["name"], record["priority"]) == ("from-file", 7)
    assert cli("wait", str(record["id"])).exit_code == 1  # FAILED


def test_wait_exit_status_follows_the_end_state(cli: Callable[..., Result]) -> None:
    record = _submit(cli, "--time", "1s", "--", "sleep", "30")
    assert cli("wait", str(record["id"])).exit_code == 3  # TIMEOUT
    running = _submit(cli, "--", "sleep", "30")
    assert cli("wait", str(running["id"]), "--timeout", "0.5").exit_code == 124
    assert cli("cancel", str(running["id"])).exit_code == 0
    assert cli("wait", str(running["id"])).exit_code == 2  # CANCELLED


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "GITHUB_TOKEN=ghp_x", "--", "true"], "GITHUB_TOKEN looks like a secret"),
        (["--nodes", "0", "--", "true"], "key 'nodes'"),
        (["--nodes", "2", "--", "true"], "nodes must be 1"),
        (["--gpus-per-node", "99", "--", "true"], "GPU"),
        (["--cpus-per-node", "4096", "--", "true"], "CPU cores"),
        (["--mem", "lots", "--", "true"], "memory 'lots'"),
        ([], "nothing to run"),
    ],
)
def test_bad_submissions_get_one_message_and_store_nothing(
    cli: Callable[..., Result], args: list[str], message: str
) -> None:
    result = cli("submit", *args)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert json.loads(cli("list", "--json").output) == []


def test_malformed_spec_file(cli: Callable[..., Result], tmp_path: Path) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text('command = ["x"]\nnodez = 2\n')
    result = cli("submit", str(spec))
    assert result.exit_code == 2 and f"{spec}: key 'nodez': unknown key" in result.output
    assert json.loads(cli("list", "--json").output) == []


def test_dryrun_prints_and_stores_nothing(cli: Callable[..., Result]) -> None:
    result = cli("submit", "--dryrun", "--env", "A=1", "--", "python", "train.py")
    assert result.exit_code == 0
    assert "python train.py" in result.output and "A=1" in result.output
    assert json.loads(cli("list", "--json").output) == []


def test_cancel_by_filter_asks_first(cli: Callable[..., Result]) -> None:
    ids = [_submit(cli, "--name", f"sweep-{i}", "--", "sleep", "30")["id"] for i in range(2)]
    keep = _submit(cli, "--name", "keep", "--", "sleep", "30")["id"]
    declined = cli("cancel", "--name", "sweep", input="n\n")
    assert "nothing cancelled" in declined.output
    assert cli("cancel", "--name", "sweep", "--yes").exit_code == 0
    for job_id in ids:
        assert cli("wait", str(job_id)).exit_code == 2
    assert json.loads(cli("describe", str(keep), "--json").output)["state"] in ("QUEUED", "STARTING", "RUNNING")
    assert cli("cancel", str(keep), str(ids[0])).exit_code == 0  # an ended job among them is fine


def test_retry_links_a_new_job(cli: Callable[..., Result]) -> None:
    record = _submit(cli, "--", "sh", "-c", "exit 1")
    cli("wait", str(record["id"]))
    result = cli("retry", "--json", str(record["id"]))
    new = json.loads(result.output)
    assert new["retry_of"] == record["id"] and new["id"] != record["id"]
    assert json.loads(cli("describe", str(record["id"]), "--json").output)["state"] == "FAILED"


def test_daemon_commands(cli: Callable[..., Result]) -> None:
    assert cli("daemon", "status").exit_code == 1
    started = cli("daemon", "start")
    assert started.exit_code == 0 and "pid" in started.output
    assert cli("daemon", "status").exit_code == 0
    assert "stopped" in cli("daemon", "stop").output
    assert cli("daemon", "status").exit_code == 1


def test_unknown_job_is_a_clear_error(cli: Callable[..., Result]) -> None:
    result = cli("describe", "999")
    assert result.exit_code == 2 and "no job 999" in result.output


def test_submit_through_the_running_daemon_loads_neither_sqlalchemy_nor_pydantic(
    cli: Callable[..., Result], sqlite_db: str, tmp_path: Path
) -> None:
    assert cli("daemon", "start").exit_code == 0
    code = (
        "import sys\nfrom clusterx.cli import main\n"
        "try:\n    main(['submit', '--json', '--name', 'quick', '--', 'true'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('sqlalchemy', 'pydantic', 'alembic') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    env = {**os.environ, "CLUSTERX_DB": sqlite_db, "CLUSTERX_RUNS_DIR": str(tmp_path / "runs")}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, timeout=60, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["name"] == "quick" and record["user"] == getpass.getuser()
    assert record["run_dir"].startswith(str(tmp_path / "runs"))
    assert record["spec"]["workdir"] == str(Path.cwd())
    bad = subprocess.run([sys.executable, "-c", code.replace("'--name'", "'--nodes', '0', '--name'")], env=env,
                         timeout=60, capture_output=True, text=True, check=False)  # fmt: skip
    assert "key 'nodes'" in bad.stderr and "Traceback" not in bad.stderr


def test_a_running_daemon_that_cannot_be_reached_is_a_visible_fallback(
    cli: Callable[..., Result], sqlite_db: str
) -> None:
    from clusterx.daemon.control import daemon_pid
    from clusterx.daemon.fastpath import socket_path
    from clusterx.db.engine import resolve_db_url

    assert cli("daemon", "start").exit_code == 0
    url = resolve_db_url(sqlite_db)
    socket_path(url).unlink()  # the daemon runs, but nobody can reach it
    result = cli("submit", "--name", "slow-way", "--", "true")
    assert result.exit_code == 0, result.output
    assert f"warning: the daemon (pid {daemon_pid(url)}) could not take the job" in result.output
    assert "socket" in result.output and "submitting without it" in result.output
    listed = json.loads(cli("list", "--json").output)
    assert [r["name"] for r in listed] == ["slow-way"]
