"""The ``molpredict`` click group: one-line errors with exit codes, the global options.

The command modules (``molpredict/cli/<topic>.py``) attach their commands to :data:`cli` from here; the package
imports them, so no command module imports the package.
"""
from __future__ import annotations

import os

import click

from molpredict import __version__
from molpredict.errors import MolpredictError

__all__ = ["cli", "MolpredictGroup"]


class MolpredictGroup(click.Group):
    """A click group that turns library errors into one-line messages and exit codes."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except MolpredictError as exc:
            click.echo(f"molpredict: error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("molpredict: interrupted", err=True)
            ctx.exit(130)


@click.group(cls=MolpredictGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="molpredict")
@click.option("--plugins-dir", type=click.Path(file_okay=False), envvar="MOLPREDICT_PLUGINS_DIR",
              help="Directory of *.py plugin files to load (env MOLPREDICT_PLUGINS_DIR).")
def cli(plugins_dir: str | None) -> None:
    """Identify molecules from MS/MS spectra by (sketched) output kernel regression.

    \b
    Typical use:
      molpredict train train.mgf -o mymodel        # fit a model bundle
      molpredict identify query.mgf --model mymodel --library lib.tsv
      molpredict plugins list                       # kernels, sketches, models available
    """
    if plugins_dir:
        os.environ["MOLPREDICT_PLUGINS_DIR"] = plugins_dir
