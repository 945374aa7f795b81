"""Command line of xtop."""

from __future__ import annotations

from pathlib import Path

import click

from xtop import __version__


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="xtop")
@click.option(
    "--db", default=None, help="clusterx database (SQLite path or URL); default: CLUSTERX_DB, else clusterx's own."
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="A run directory to follow (else the one of the job selected in the table).",
)
@click.option("--refresh", "refresh_s", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              help="Seconds between refreshes.")  # fmt: skip
def main(db: str | None, run_dir: Path | None, refresh_s: float) -> None:
    """Terminal dashboard: this machine's resources, clusterx jobs, and a run's progress and deeptrace findings.

    Keys: q quits, r refreshes now, arrows and Enter select a job to follow its run directory.
    """
    from xtop.app import XtopApp  # noqa: PLC0415 (keeps --help fast)

    XtopApp(db=db, run_dir=run_dir, refresh_s=refresh_s).run()
