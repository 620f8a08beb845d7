"""The ``molpredict`` click group: one-line errors with exit codes, the global options.

The command modules (``molpredict/cli/<topic>.py``) attach their commands to :data:`cli` from here; the package
imports them, so no command module imports the package.
"""
from __future__ import annotations

import errno
import os

import click

from molpredict import __version__
from molpredict.errors import InputError, MolpredictError, ResourceError

__all__ = ["cli", "MolpredictGroup"]

_RESOURCE_ERRNOS = {errno.ENOSPC, errno.ENOMEM, getattr(errno, "EDQUOT", errno.ENOSPC)}


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
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except OSError as exc:  # a file the library did not check: still one line naming it
            where = f"{exc.filename}: " if exc.filename else ""
            click.echo(f"molpredict: error: {where}{exc.strerror or exc}", err=True)
            ctx.exit(ResourceError.exit_code if exc.errno in _RESOURCE_ERRNOS else InputError.exit_code)
        except EOFError as exc:  # click would print a bare "Aborted!" for it
            click.echo(f"molpredict: error: an input ended early (truncated file?): {exc}", err=True)
            ctx.exit(InputError.exit_code)
        except Exception as exc:
            if os.environ.get("MOLPREDICT_DEBUG"):
                raise
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            click.echo(f"molpredict: internal error: {type(exc).__name__}: {first_line} (a bug: run again with "
                       f"MOLPREDICT_DEBUG=1 for the traceback, and report it)", err=True)
            ctx.exit(1)


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
