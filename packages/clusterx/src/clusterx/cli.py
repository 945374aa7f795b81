"""Command line of clusterx: a thin layer over `clusterx.Client`.

Imports are lazy: `clusterx --help` loads neither SQLAlchemy nor pydantic, and each command loads only what it
uses. User errors (ValueError subclasses of clusterx.errors) print one message and exit with status 2.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from clusterx import __version__
from clusterx.backends.registry import BACKEND_NAMES, BACKENDS, DEFAULT_BACKEND

if TYPE_CHECKING:
    from clusterx.client import Client
    from clusterx.daemon.messages import RecordReply
    from clusterx.record import JobRecord

F = TypeVar("F", bound=Callable[..., Any])

# `clusterx wait` exit status per end state (documented in docs/clusterx.md).
WAIT_EXIT_CODES = {
    "SUCCEEDED": 0,
    "FAILED": 1,
    "CANCELLED": 2,
    "TIMEOUT": 3,
    "PREEMPTED": 4,
    "NODE_FAIL": 5,
    "LOST": 6,
}
WAIT_TIMED_OUT = 124
USER_ERROR = 2


def user_errors(fn: F) -> F:
    """Print a user error's message (no traceback) and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from clusterx.errors import ClusterxError  # noqa: PLC0415 (lazy, see module doc)

        try:
            return fn(*args, **kwargs)
        except ClusterxError as exc:
            click.echo(f"clusterx: error: {exc}", err=True)
            sys.exit(USER_ERROR)

    return cast(F, wrapper)


def _client(ctx: click.Context) -> Client:
    from clusterx.client import Client  # noqa: PLC0415

    obj = ctx.find_root().obj
    if obj.get("client") is None:
        obj["client"] = Client(obj.get("db"))
    return cast("Client", obj["client"])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="clusterx")
@click.option(
    "--db",
    metavar="URL|PATH",
    help="database: a SQLite file or postgresql://... [default: $CLUSTERX_DB, else "
    "$XDG_DATA_HOME/clusterx/clusterx.db]",
)
@click.pass_context
def main(ctx: click.Context, db: str | None) -> None:
    """clusterx: run jobs on this machine (an embedded scheduler daemon) or on Slurm, with one job history
    in SQL."""
    ctx.ensure_object(dict)
    ctx.obj["db"] = db


# -- submit -----------------------------------------------------------------------------------------------------
@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--name", help="job name [default: the program's name]")
@click.option("--workdir", help="working directory [default: the current one]")
@click.option("--env", "env", multiple=True, metavar="KEY=VALUE", help="add to the job's environment (KEY alone: "
              "take the value from this shell); repeatable")  # fmt: skip
@click.option("--nodes", type=int, help="number of nodes [1]")
@click.option("--procs-per-node", type=int, help="processes per node [1]")
@click.option("--gpus-per-node", type=int, help="GPUs per node [0]")
@click.option("--cpus-per-node", type=int, help="CPU cores per node [procs per node]")
@click.option("--mem", "mem_per_node", help="memory per node, e.g. 16G")
@click.option("--time", "time_limit", help="time limit, e.g. 01:30:00 or 90m")
@click.option("--priority", type=int, help="higher runs first [0]")
@click.option("--max-retries", type=int, help="extra attempts after a failure [0]")
@click.option("--requeue", is_flag=True, default=None, help="let the backend requeue the job itself (Slurm: node "
              "failure, preemption); each run is the next attempt")  # fmt: skip
@click.option("--partition", help="Slurm partition")
@click.option("--run-dir", help="run directory [chosen by clusterx]")
@click.option("--backend", type=click.Choice(BACKEND_NAMES), help=f"where to run [{DEFAULT_BACKEND}]")
@click.option("--backend-option", "backend_options", multiple=True, metavar="KEY=VALUE", help="repeatable")
@click.option("--submit-key", help="idempotency key: a repeated submit with the same key returns the same job")
@click.option("--dryrun", is_flag=True, help="print what would be submitted (for Slurm, the sbatch script); "
              "store nothing")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="print the job record as JSON")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
@user_errors
def submit(ctx: click.Context, /, args: tuple[str, ...], dryrun: bool, as_json: bool, **options: Any) -> None:
    """Submit a job: `clusterx submit [OPTIONS] -- CMD ARGS...` or `clusterx submit [OPTIONS] SPEC.toml`.

    Options come before the command or spec file; options given override the spec file's values. The job
    gets only the allow-listed variables of this shell (PATH, HOME, LANG, LC_*, VIRTUAL_ENV, ...) plus --env.
    """
    from clusterx.paths import resolve_db_url  # noqa: PLC0415

    mapping, source = spec_mapping(args, options)
    db = ctx.find_root().obj.get("db")
    backend = BACKENDS.get(mapping.get("backend", DEFAULT_BACKEND))  # an unknown name: JobSpec says so below
    if not dryrun and backend is not None and backend.needs_daemon:
        # The quick way: the running daemon validates and stores the job (see clusterx.daemon.fastpath).
        from clusterx.daemon.fastpath import Unreachable, submit_via_daemon  # noqa: PLC0415

        # Chosen here, so that falling back after a daemon that stored the job but answered too late returns that
        # job instead of a second one.
        mapping.setdefault("submit_key", os.urandom(16).hex())  # a uuid4's randomness; `uuid` costs 20 ms
        answer = submit_via_daemon(resolve_db_url(db), mapping, source, os.environ.get("CLUSTERX_RUNS_DIR"))
        if not isinstance(answer, Unreachable):
            _print_submitted(answer, as_json)
            return
        if answer.daemon_pid is not None:
            click.echo(
                f"clusterx: warning: the daemon (pid {answer.daemon_pid}) could not take the job: {answer.reason}; "
                "submitting without it (slower)",
                err=True,
            )
    from clusterx.spec import JobSpec  # noqa: PLC0415

    spec = JobSpec.from_mapping(mapping, source=source)
    client = _client(ctx)
    if dryrun:
        click.echo(client.dryrun(spec), nl=False)
        return
    _print_submitted(client.submit(spec), as_json)


def _print_submitted(submitted: JobRecord | RecordReply, as_json: bool) -> None:
    """The new job's record, or its line; from the daemon's reply (the quick way, no pydantic) or a JobRecord."""
    from clusterx.daemon.messages import RecordReply  # noqa: PLC0415

    if isinstance(submitted, RecordReply):
        click.echo(json.dumps(submitted.record, indent=2) if as_json else submitted.summary)
    else:
        click.echo(submitted.to_json() if as_json else submitted.summary())


def spec_mapping(args: tuple[str, ...], options: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The spec as a plain mapping (validated later by JobSpec) and where it came from, for messages.
    Paths are made absolute here, against the submitter's working directory."""
    from pathlib import Path  # noqa: PLC0415

    from clusterx.environment import env_from_shell, parse_env_assignment  # noqa: PLC0415
    from clusterx.errors import SpecError  # noqa: PLC0415
    from clusterx.specfile import read_spec_file  # noqa: PLC0415

    env = env_from_shell(os.environ)
    for item in options.pop("env"):
        if "=" in item:
            key, value = parse_env_assignment(item)
        elif item in os.environ:
            key, value = item, os.environ[item]
        else:
            raise SpecError(f"--env {item}: not set in this shell; give --env {item}=VALUE")
        env[key] = value
    backend_options = {}
    for item in options.pop("backend_options"):
        key, sep, value = item.partition("=")
        if not sep:
            raise SpecError(f"--backend-option {item!r}: expected KEY=VALUE")
        backend_options[key] = value
    given = {key: value for key, value in options.items() if value is not None}
    if backend_options:
        given["backend_options"] = backend_options
    if len(args) == 1 and args[0].endswith(".toml"):
        source = args[0]
        mapping = read_spec_file(Path(source))
        file_env = mapping.get("env", {})
        mapping.update(given)
        mapping["env"] = {**env, **file_env} if isinstance(file_env, dict) else file_env
    elif args:
        source = "command line"
        mapping = {**given, "command": list(args), "env": env}
    else:
        raise SpecError("nothing to run: give a command after `--` (clusterx submit -- python train.py) or a SPEC.toml")
    for key in ("workdir", "run_dir"):
        if isinstance(mapping.get(key), str):
            mapping[key] = str(Path(mapping[key]).resolve())
    mapping.setdefault("workdir", str(Path.cwd()))
    return mapping, source


# -- list / describe --------------------------------------------------------------------------------------------
@main.command("list")
@click.option("--state", "states", multiple=True, help="only jobs in this state (repeatable, or comma-separated)")
@click.option("--user", help="only this user's jobs")
@click.option("--name", help="name contains this (or matches, with * and ?)")
@click.option("--backend", help="only jobs of this backend")
@click.option("--limit", type=int, default=50, show_default=True, help="newest N jobs (0: all)")
@click.option("--json", "as_json", is_flag=True, help="JSON list of job records")
@click.pass_context
@user_errors
def list_jobs(
    ctx: click.Context,
    *,
    states: tuple[str, ...],
    user: str | None,
    name: str | None,
    backend: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List jobs, newest first."""
    wanted = _parse_states(states)
    client = _client(ctx)
    records = client.list(states=wanted, user=user, name=name, backend=backend, limit=limit or None)
    _warn_poll_errors(client)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in records], indent=2))
        return
    click.echo(f"{'ID':>6}  {'NAME':<24} {'USER':<10} {'BACKEND':<7} {'STATE':<10} {'TRY':>3} {'EXIT':>4}  CREATED")
    for r in records:
        exit_code = "" if r.exit_code is None else str(r.exit_code)
        click.echo(
            f"{r.id:>6}  {r.name[:24]:<24} {r.user[:10]:<10} {r.backend:<7} {r.state:<10} "
            f"{r.attempt:>3} {exit_code:>4}  {r.created_at.isoformat()[:19]}"
        )


def _warn_poll_errors(client: Client) -> None:
    """A backend that could not be asked leaves its jobs as last seen: say so on stderr, keep stdout clean."""
    for message in client.poll_errors:
        click.echo(f"warning: {message}; states shown are the last ones seen", err=True)


def _parse_states(states: tuple[str, ...]) -> list[str]:
    from clusterx.errors import SpecError  # noqa: PLC0415
    from clusterx.states import JobState  # noqa: PLC0415

    wanted = [s.strip().upper() for item in states for s in item.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in JobState.__members__]
    if unknown:
        raise SpecError(f"unknown state(s) {unknown}; states are {', '.join(JobState.__members__)}")
    return wanted


@main.command()
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="the full job record as JSON (the stable contract)")
@click.pass_context
@user_errors
def describe(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """Show one job: its record, attempts and state changes."""
    client = _client(ctx)
    record = client.describe(job_id)
    _warn_poll_errors(client)
    if as_json:
        click.echo(record.to_json())
        return
    # Every field but the long ones, as JSON shows it (times with 'Z'), in the record's own order.
    shown = record.model_dump(mode="json", exclude={"spec", "rendered_request", "events", "attempts"})
    for key, value in shown.items():
        click.echo(f"{key:>16}: {json.dumps(value) if isinstance(value, dict | list) else value}")
    click.echo(f"{'command':>16}: {' '.join(record.spec.command)}")
    click.echo("events:")
    for event in record.events or []:
        click.echo(f"  {event.at.isoformat()[:23]}  #{event.attempt} {event.from_state or '-':>9} → "
                   f"{event.to_state:<10} [{event.source}] {event.message}")  # fmt: skip


# -- logs -------------------------------------------------------------------------------------------------------
@main.command()
@click.argument("job_id", type=int)
@click.option("--follow", "-f", is_flag=True, help="keep printing new output until the job ends")
@click.option("--grep", "pattern", help="only lines matching this regular expression")
@click.option("--rank", type=int, help="the log of one rank (RUN_DIR/logs/rank-R.log)")
@click.option("--stderr", is_flag=True, help="standard error instead of standard output")
@click.pass_context
@user_errors
def logs(ctx: click.Context, *, job_id: int, follow: bool, pattern: str | None, rank: int | None, stderr: bool) -> None:
    """Print a job's output."""
    from clusterx.errors import SpecError  # noqa: PLC0415
    from clusterx.logs import follow_lines, read_lines  # noqa: PLC0415

    client = _client(ctx)
    try:
        regex = re.compile(pattern) if pattern else None
    except re.error as exc:
        raise SpecError(f"--grep {pattern!r}: not a regular expression: {exc}") from None
    path = client.log_file(job_id, "stderr" if stderr else "stdout", rank)
    if follow:
        lines = follow_lines(path, lambda: client.is_live(job_id), regex)
    else:
        if not path.exists():
            raise SpecError(f"job {job_id} has no log at {path} yet")
        lines = read_lines(path, regex)
    for line in lines:
        click.echo(line, nl=False)


# -- cancel / wait / retry --------------------------------------------------------------------------------------
@main.command()
@click.argument("job_ids", nargs=-1, type=int)
@click.option("--state", "states", multiple=True, help="cancel your live jobs in this state")
@click.option("--name", help="cancel your live jobs whose name contains this")
@click.option("--backend", help="cancel your live jobs of this backend")
@click.option("--all", "all_jobs", is_flag=True, help="cancel all your live jobs")
@click.option("--yes", "-y", is_flag=True, help="do not ask for confirmation")
@click.pass_context
@user_errors
def cancel(
    ctx: click.Context,
    *,
    job_ids: tuple[int, ...],
    states: tuple[str, ...],
    name: str | None,
    backend: str | None,
    all_jobs: bool,
    yes: bool,
) -> None:
    """Cancel jobs by id, or your live jobs that match filters (asks first). Cancelling an ended job is fine."""
    from clusterx.errors import SpecError  # noqa: PLC0415
    from clusterx.states import LIVE_STATES  # noqa: PLC0415

    client = _client(ctx)
    ids = list(job_ids)
    by_filter = bool(states or name or backend or all_jobs)
    if by_filter:
        wanted = _parse_states(states) or list(LIVE_STATES)
        matches = client.list(states=wanted, user=client.user, name=name, backend=backend, limit=None)
        matches = [r for r in matches if r.live]
        if not matches:
            click.echo("no live job of yours matches")
            return
        for r in matches:
            click.echo(f"  {r.id:>6}  {r.name:<24} {r.state}")
        if not yes and not click.confirm(f"cancel these {len(matches)} job(s)?", default=False):
            click.echo("nothing cancelled")
            return
        ids += [r.id for r in matches]
    if not ids:
        raise SpecError("give job ids, or filters (--state, --name, --backend, --all)")
    for job_id, state in client.cancel(ids).items():
        if state.value == "CANCELLED":
            note = ""
        elif state.is_terminal:
            note = " (had already ended)"
        else:
            note = " (cancel requested; the backend stops it)"
        click.echo(f"job {job_id}: {state.value}{note}")


@main.command()
@click.argument("job_id", type=int)
@click.option("--timeout", type=float, help="give up after this many seconds (exit 124)")
@click.option("--json", "as_json", is_flag=True, help="print the final job record as JSON")
@click.pass_context
@user_errors
def wait(ctx: click.Context, job_id: int, timeout: float | None, as_json: bool) -> None:
    """Wait for a job to end. Exit status: 0 SUCCEEDED, 1 FAILED, 2 CANCELLED, 3 TIMEOUT, 4 PREEMPTED,
    5 NODE_FAIL, 6 LOST, 124 still running when --timeout ran out."""
    record = _client(ctx).wait(job_id, timeout_s=timeout)
    if as_json:
        click.echo(record.to_json())
    else:
        reason = f" ({record.failure_reason})" if record.failure_reason else ""
        click.echo(f"job {job_id} {record.state}{reason}")
    sys.exit(WAIT_EXIT_CODES.get(record.state, WAIT_TIMED_OUT))


@main.command()
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="print the new job record as JSON")
@click.pass_context
@user_errors
def retry(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """Submit an ended job again, as a new job linked to it (the ended job is not changed)."""
    record = _client(ctx).retry(job_id)
    if as_json:
        click.echo(record.to_json())
    else:
        click.echo(f"job {record.id} {record.state} (retry of job {job_id})")


@main.command()
@click.argument("job_id", type=int)
@click.argument("value", type=int)
@click.pass_context
@user_errors
def priority(ctx: click.Context, job_id: int, value: int) -> None:
    """Change a live job's priority (higher runs first; jobs the local daemon schedules)."""
    record = _client(ctx).set_priority(job_id, value)
    click.echo(f"job {job_id}: priority {record.priority}")


# -- daemon -----------------------------------------------------------------------------------------------------
@main.group()
def daemon() -> None:
    """The local scheduler daemon of the database (one per database and machine)."""


def _db_url(ctx: click.Context) -> str:
    from clusterx.db.engine import resolve_db_url  # noqa: PLC0415

    return resolve_db_url(ctx.find_root().obj.get("db"))


@daemon.command("start")
@click.option("--idle-exit", type=float, help="exit after this many seconds with nothing to run")
@click.pass_context
@user_errors
def daemon_start(ctx: click.Context, idle_exit: float | None) -> None:
    """Start the daemon (no-op when it runs)."""
    from clusterx.daemon.control import start_daemon  # noqa: PLC0415

    url = _db_url(ctx)
    _client(ctx)  # creates or migrates the database first
    click.echo(f"daemon running, pid {start_daemon(url, idle_exit_s=idle_exit)}")


@daemon.command("stop")
@click.pass_context
@user_errors
def daemon_stop(ctx: click.Context) -> None:
    """Stop the daemon; running jobs keep running and are adopted by the next daemon."""
    from clusterx.daemon.control import stop_daemon  # noqa: PLC0415

    pid = stop_daemon(_db_url(ctx))
    click.echo("no daemon was running" if pid is None else f"daemon {pid} stopped")


@daemon.command("status")
@click.pass_context
@user_errors
def daemon_status(ctx: click.Context) -> None:
    """Say whether the daemon runs (exit 0) or not (exit 1)."""
    from clusterx.daemon.control import daemon_pid, log_path  # noqa: PLC0415

    url = _db_url(ctx)
    pid = daemon_pid(url)
    if pid is None:
        click.echo("daemon not running")
        sys.exit(1)
    click.echo(f"daemon running, pid {pid}, log {log_path(url)}")
