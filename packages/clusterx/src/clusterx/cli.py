"""Command line of clusterx."""

import click

from clusterx import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="clusterx")
def main() -> None:
    """clusterx."""
