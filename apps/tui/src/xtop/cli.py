"""Command line of xtop."""

import click

from xtop import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="xtop")
def main() -> None:
    """xtop."""
