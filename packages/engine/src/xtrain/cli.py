"""Command line of xtrain."""

import click

from xtrain import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="xtrain")
def main() -> None:
    """xtrain."""
