"""The ``molpredict`` command line: a thin click layer over the library (no math here).

Every :class:`molpredict.errors.MolpredictError` becomes one line on stderr and the error's exit code.
Command groups live in one module each (``molpredict/cli/<topic>.py``) and attach themselves to ``cli``.
"""
from __future__ import annotations

import os
import sys

import click

from .. import __version__
from ..errors import MolpredictError

__all__ = ["cli", "main"]


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


def _preset_plugins_dir(argv: list[str]) -> None:
    """Honour ``--plugins-dir`` before the registry is built (plugins may add commands)."""
    for i, arg in enumerate(argv):
        if arg == "--plugins-dir" and i + 1 < len(argv):
            os.environ["MOLPREDICT_PLUGINS_DIR"] = argv[i + 1]
        elif arg.startswith("--plugins-dir="):
            os.environ["MOLPREDICT_PLUGINS_DIR"] = arg.split("=", 1)[1]


# Command modules attach their commands to ``cli`` on import.
from . import plugins  # noqa: E402,F401
from . import spectra  # noqa: E402,F401
from . import candidates  # noqa: E402,F401
from . import identification  # noqa: E402,F401
from . import dsokr  # noqa: E402,F401
from . import config  # noqa: E402,F401
from . import report  # noqa: E402,F401


def _add_plugin_commands() -> None:
    from ..registry import get_registry
    try:
        get_registry().register_commands(cli)
    except MolpredictError as exc:
        click.echo(f"molpredict: error: {exc}", err=True)
        sys.exit(exc.exit_code)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _preset_plugins_dir(argv)
    _add_plugin_commands()
    cli.main(args=argv, prog_name="molpredict")

