"""Command line of xtop."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from xtop import __version__

USER_ERROR = 2


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="xtop")
@click.option(
    "--db", default=None, metavar="URL|PATH",
    help="clusterx database (SQLite path or URL); default: CLUSTERX_DB, else clusterx's own.",
)  # fmt: skip
@click.option("--refresh", "refresh_s", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between refreshes.")  # fmt: skip
@click.option("--stale-after", "stale_after_s", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="A running rank without progress for this many seconds is flagged STALE.")  # fmt: skip
@click.option("--run-dir", "extra_run_dirs", multiple=True, type=click.Path(path_type=Path), hidden=True,
              help="Same as a RUN_DIR argument (kept for older scripts).")  # fmt: skip
@click.argument("run_dirs", nargs=-1, type=click.Path(path_type=Path))
def main(
    db: str | None, refresh_s: float, stale_after_s: float, extra_run_dirs: tuple[Path, ...], run_dirs: tuple[Path, ...]
) -> None:
    """Terminal dashboard: clusterx jobs, a run's progress (RUN_DIR ...), this machine's devices, deeptrace's
    findings. Keys: 1 jobs, 2 run, 3 devices, 4 trace, ? help, q quit."""
    runs = [*run_dirs, *extra_run_dirs]
    for run_dir in runs:
        if run_dir.exists() and not run_dir.is_dir():
            click.echo(f"xtop: error: {run_dir}: not a directory (give a run directory)", err=True)
            sys.exit(USER_ERROR)
    from xtop.app import XtopApp  # noqa: PLC0415 (keeps --help fast)

    XtopApp(db=db, run_dirs=runs, refresh_s=refresh_s, stale_after_s=stale_after_s).run()
