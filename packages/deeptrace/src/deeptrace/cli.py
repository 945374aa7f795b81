"""Command line of deeptrace."""

import click

from deeptrace import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="deeptrace")
def main() -> None:
    """deeptrace."""
