"""Command line of deeptrace. Heavy modules (numpy, matplotlib) are imported inside commands: --help stays fast."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from deeptrace import __version__

EXIT_RULE_MET = 1
EXIT_BAD_INPUT = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="deeptrace")
def main() -> None:
    """deeptrace: where a distributed training run spends its time, who it waits for, where it hangs."""


def _fail(message: str) -> None:
    click.echo(f"deeptrace: error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def _job_run_dir(job_id: int) -> Path:
    """The run directory of a clusterx job, from `clusterx describe ID --json` read as a clusterx JobRecord. The
    command, not clusterx's Client: it is the record's stable interface, and a clusterx newer than the one deeptrace
    imports says so (a newer record version) instead of being misread. The job database is clusterx's default or
    $CLUSTERX_DB."""
    import shutil  # noqa: PLC0415  # lazy: keeps --help and light commands fast
    import subprocess  # noqa: PLC0415

    from clusterx.record import JobRecordError, read_job_record  # noqa: PLC0415  # pydantic: only for --job

    beside = Path(sys.executable).parent / "clusterx"
    command = str(beside) if beside.is_file() else shutil.which("clusterx")
    if command is None:
        _fail(f"--job {job_id}: the clusterx command is not installed (it finds the job's run directory)")
    assert command is not None  # _fail exits
    try:
        result = subprocess.run(
            [command, "describe", str(job_id), "--json"], capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        _fail(f"--job {job_id}: clusterx describe failed ({err})")
    if result.returncode != 0:
        said = [line for line in result.stderr.strip().splitlines() if line.strip()]
        _fail(f"--job {job_id}: " + (said[-1] if said else f"clusterx describe exited with status {result.returncode}"))
    try:
        record = read_job_record(result.stdout, source=f"clusterx describe {job_id} --json")
    except JobRecordError as err:
        _fail(f"--job {job_id}: {err}")
    if not record.run_dir:
        _fail(f"--job {job_id}: the job has no run directory")
    return Path(record.run_dir)


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False), required=False)
@click.option("--job", "job_id", type=click.IntRange(min=1), default=None, metavar="ID",
              help="Analyse the run directory of clusterx job ID (from `clusterx describe ID --json`).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print report.json to stdout instead of the terminal report.")
@click.option("--merge", is_flag=True, help="Also write merged_trace.json: all ranks in one Perfetto trace.")
@click.option("--fail-on", "fail_on", default="", metavar="RULES",
              help="Exit 1 when a rule is met, e.g. 'overlap<50,straggler,hang' (see docs/deeptrace.md).")  # fmt: skip
@click.option("--output", "-o", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Folder for the report files (default RUN_DIR/deeptrace).")  # fmt: skip
@click.option("--classify", "classify_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="TOML file of kernel-name patterns (keys comm, memory, sync, compute, suspect_comm).")  # fmt: skip
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None, help="Parallel processes (default: CPUs).")
@click.option("--no-clock-sync", is_flag=True, help="Do not correct clock offsets estimated from collectives.")
@click.option("--no-png", is_flag=True, help="Skip summary.png.")
@click.option("--stall-after", "stall_after", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Hang diagnosis: a rank idle this long counts as stopped (default 120).")  # fmt: skip
def analyze(
    *,
    run_dir: Path | None,
    job_id: int | None,
    as_json: bool,
    merge: bool,
    fail_on: str,
    output: Path | None,
    classify_file: Path | None,
    jobs: int | None,
    no_clock_sync: bool,
    no_png: bool,
    stall_after: float | None,
) -> None:
    """Analyse RUN_DIR (or the run directory of clusterx job --job ID): an xtrain run directory or a folder of
    PyTorch profiler (Kineto) traces.

    Writes report.json, report.md and summary.png into RUN_DIR/deeptrace (or --output DIR) and prints the report.
    """
    if (run_dir is None) == (job_id is None):
        _fail("give either RUN_DIR or --job ID")
    if job_id is not None:
        run_dir = _job_run_dir(job_id)
    assert run_dir is not None
    from deeptrace.analysis.inputs import NoInputError  # noqa: PLC0415  # lazy: keeps --help and light commands fast
    from deeptrace.analysis.run import analyse_run  # noqa: PLC0415  # lazy: keeps --help and light commands fast
    from deeptrace.classify import ClassifyConfig, load_classify_config  # noqa: PLC0415  # lazy: keeps --help and light commands fast
    from deeptrace.report.outputs import OutputDirError, output_dir, report_json_bytes, write_outputs  # noqa: PLC0415  # lazy: keeps --help and light commands fast
    from deeptrace.report.rules import parse_rules  # noqa: PLC0415  # lazy: keeps --help and light commands fast
    from deeptrace.report.schema import build_report  # noqa: PLC0415  # lazy: keeps --help and light commands fast

    try:
        rules = parse_rules(fail_on)
        classify = load_classify_config(classify_file) if classify_file else ClassifyConfig()
        folder = output_dir(run_dir, output) if run_dir.is_dir() else None  # checked before a long analysis
    except (ValueError, OutputDirError) as err:
        _fail(str(err))
    try:
        analysis = analyse_run(
            run_dir,
            classify=classify,
            jobs=jobs,
            keep_rows=merge,
            clock_sync=not no_clock_sync,
            stall_after_s=stall_after,
            warn=lambda message: click.echo(f"deeptrace: warning: {message}", err=True),
        )
    except NoInputError as err:
        _fail(str(err))
    if not analysis.ranks and analysis.hang is None and analysis.flight_recorder is None:
        _fail(f"{run_dir}: no trace could be analysed (see the warnings above)")
    report = build_report(analysis)
    assert folder is not None  # run_dir was a directory, or analyse_run raised NoInputError
    try:
        written = write_outputs(report, analysis, folder, merge=merge, png=not no_png)
    except OSError as err:
        _fail(f"{folder}: cannot write the report ({err})")
    if as_json:
        sys.stdout.buffer.write(report_json_bytes(report))
        sys.stdout.flush()
    else:
        from rich.console import Console  # noqa: PLC0415  # lazy: keeps --help and light commands fast

        from deeptrace.report.terminal import render_terminal  # noqa: PLC0415  # lazy: keeps --help and light commands fast

        console = Console()
        render_terminal(report, console)
        console.print("Written: " + ", ".join(str(p) for p in written.values()))
    met = [reason for rule in rules if (reason := rule.met(report)) is not None]
    for reason in met:
        click.echo(f"deeptrace: --fail-on {reason}", err=True)
    if met:
        sys.exit(EXIT_RULE_MET)


def _step_choice(value: str) -> str | int:
    """--step: 'first', 'all' or a step number."""
    if value in ("first", "all"):
        return value
    if value.isdigit():
        return int(value)
    _fail(f"--step {value}: give a step number, 'first' or 'all'")
    return value  # _fail exits


@main.command()
@click.argument("run_a", type=click.Path(path_type=Path, file_okay=False))
@click.argument("run_b", type=click.Path(path_type=Path, file_okay=False))
@click.option("--rank", type=click.IntRange(min=0), default=None,
              help="Rank whose ops, spans and collectives are compared (default: the lowest of each).")  # fmt: skip
@click.option("--step", "step", default="first", show_default=True, metavar="N|all|first",
              help="Profiler (or optimizer) step compared on both sides; 'all' takes every step.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the diff as JSON instead of tables.")
@click.option("--output", "-o", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Write diff.json, diff.md and diff.png into DIR.")  # fmt: skip
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None, help="Parallel processes (default: CPUs).")
@click.option("--no-png", is_flag=True, help="With --output: skip diff.png.")
def diff(
    *, run_a: Path, run_b: Path, rank: int | None, step: str, as_json: bool, output: Path | None, jobs: int | None,
    no_png: bool,
) -> None:  # fmt: skip
    """What changed from RUN_A to RUN_B (run directories or folders of Kineto traces): per op, per kind of
    collective, per rank and per span, largest changes first (docs/deeptrace.md, "deeptrace diff")."""
    choice = _step_choice(step)
    from deeptrace.diff.compare import compare  # noqa: PLC0415  # lazy: keeps --help and light commands fast
    from deeptrace.diff.render import diff_json_bytes, render_terminal, write_outputs  # noqa: PLC0415  # lazy
    from deeptrace.diff.side import DiffInputError, load_side  # noqa: PLC0415  # lazy

    def warn(message: str) -> None:
        click.echo(f"deeptrace: warning: {message}", err=True)

    try:
        side_a = load_side(run_a, rank, jobs, warn)
        side_b = load_side(run_b, rank, jobs, warn)
        report = compare(side_a, side_b, choice, warn)  # type: ignore[arg-type]  # _step_choice checked it
    except DiffInputError as err:
        _fail(str(err))
    if output is not None:
        try:
            written = write_outputs(report, output, png=not no_png)
        except OSError as err:
            _fail(f"{output}: cannot write the diff ({err})")
    if as_json:
        sys.stdout.buffer.write(diff_json_bytes(report))
        sys.stdout.flush()
        return
    from rich.console import Console  # noqa: PLC0415  # lazy: keeps --help and light commands fast

    console = Console()
    render_terminal(report, console)
    if output is not None:
        console.print("Written: " + ", ".join(str(p) for p in written.values()))


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--threshold", type=click.FloatRange(min=0, min_open=True), default=120.0, show_default=True,
              metavar="S", help="A rank without progress this long is stuck.")  # fmt: skip
@click.option("--interval", type=click.FloatRange(min=0.05), default=2.0, show_default=True, metavar="S",
              help="Seconds between looks at the heartbeats and traces.")  # fmt: skip
@click.option("--once", is_flag=True, help="Judge once and exit: 0 healthy, 3 slow, 4 hung (2: a usage error).")
@click.option("--on-hang", "on_hang", default=None, metavar="CMD",
              help="On a hang, run CMD with the verdict file's path as its last argument.")  # fmt: skip
@click.option("--webhook", default=None, metavar="URL", help="On a hang, POST the verdict as JSON to URL.")
@click.option("--node", is_flag=True,
              help="Be the per-node helper: answer stack requests for this host's ranks.")  # fmt: skip
@click.option("--snapshots", type=click.IntRange(min=1), default=3, show_default=True,
              help="Stack snapshots of each rank on a hang.")  # fmt: skip
@click.option("--snapshot-gap", "snapshot_gap", type=click.FloatRange(min=0), default=2.0, show_default=True,
              metavar="S", help="Seconds between stack snapshots.")  # fmt: skip
@click.option("--stack-method", "stack_method", type=click.Choice(["auto", "py-spy", "signal"]), default="auto",
              show_default=True, help="py-spy (ptrace), signal (the Collector's in-process dump), auto: py-spy, "
              "then the signal where ptrace is refused.")  # fmt: skip
def watch(
    *,
    run_dir: Path,
    threshold: float,
    interval: float,
    once: bool,
    on_hang: str | None,
    webhook: str | None,
    node: bool,
    snapshots: int,
    snapshot_gap: float,
    stack_method: str,
) -> None:
    """Watch a live run: each rank progressing, slow or stuck; on a hang, every rank's stacks and the culprit.

    Writes RUN_DIR/deeptrace/hang-TIME/ (stacks per rank, verdict.json) for each hang (docs/deeptrace.md).
    """
    from rich.console import Console  # noqa: PLC0415  # lazy: keeps --help and light commands fast

    from deeptrace.watch.capture import CaptureConfig  # noqa: PLC0415  # lazy: keeps --help and light commands fast
    from deeptrace.watch.cli import run_node_helper, run_watch  # noqa: PLC0415  # lazy: keeps --help and light commands fast
    from deeptrace.watch.session import WatchConfig  # noqa: PLC0415  # lazy: keeps --help and light commands fast
    from deeptrace.watch.stacks import METHODS  # noqa: PLC0415  # lazy: keeps --help and light commands fast

    if not run_dir.is_dir():
        _fail(f"{run_dir}: no such directory (give the run directory of a live run)")
    if webhook is not None and not webhook.startswith(("http://", "https://")):
        _fail(f"--webhook {webhook}: not an http:// or https:// URL")
    method = next(m for m in METHODS if m == stack_method)
    err = Console(stderr=True)
    if node:
        sys.exit(run_node_helper(run_dir, err))
    config = WatchConfig(
        threshold_s=threshold,
        interval_s=interval,
        capture=CaptureConfig(snapshots=snapshots, gap_s=snapshot_gap, method=method),
        on_hang=on_hang,
        webhook=webhook,
    )
    sys.exit(run_watch(run_dir, config, once=once, console=Console(), err=err))
