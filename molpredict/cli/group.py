"""The ``molpredict`` click group: one-line errors with exit codes, the global options.

The command modules (``molpredict/cli/<topic>.py``) attach their commands to :data:`cli` from here; the package
imports them, so no command module imports the package.
"""
from __future__ import annotations

import errno
import os

import click

from molpredict import __version__
from molpredict.errors import InputError, MolpredictError, PluginError, ResourceError

__all__ = ["cli", "MolpredictGroup", "plugins_dir_problem"]

_RESOURCE_ERRNOS = {errno.ENOSPC, errno.ENOMEM, getattr(errno, "EDQUOT", errno.ENOSPC)}


def _plugin_frame(exc: BaseException) -> tuple[str, str] | None:
    """``(plugin name, "file:line")`` of the innermost traceback frame in a third-party plugin's code (its
    top-level package or plugins-directory module), or None when no plugin code is on the traceback."""
    import inspect

    from molpredict.registry import get_registry

    try:
        manager = get_registry().pm
        owners = {}
        for plugin in manager.get_plugins():
            module = plugin.__name__ if inspect.ismodule(plugin) else type(plugin).__module__
            top = module.split(".")[0]
            if top != "molpredict":
                owners[top] = manager.get_name(plugin)
    except Exception:  # the registry itself is what failed: no attribution
        return None
    found = None
    tb = exc.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "") or ""
        if module.split(".")[0] in owners:
            found = (owners[module.split(".")[0]], f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}")
        tb = tb.tb_next
    return found


def plugins_dir_problem(directory: str, from_option: bool) -> str | None:
    """The one-line usage error (exit 2) for a plugins directory that is not one, or None.

    A file is an error from either source; a directory that does not exist is one from ``--plugins-dir`` (a typo
    would load no plugin) but not from MOLPREDICT_PLUGINS_DIR alone, which may be set for every shell: the registry
    warns about it, naming the variable.
    """
    if not directory or os.path.isdir(directory):
        return None
    if os.path.exists(directory):
        return f"{directory}: is a file, not a plugins directory (--plugins-dir or MOLPREDICT_PLUGINS_DIR)"
    return f"{directory}: no such plugins directory (--plugins-dir)" if from_option else None


def _check_plugins_dir(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    # main() checks this before the registry is built; this covers a caller of `cli` itself (CliRunner)
    from click.core import ParameterSource

    problem = plugins_dir_problem(value, ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE)
    if problem is not None:
        click.echo(f"molpredict: error: {problem}", err=True)
        ctx.exit(2)
    return value


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
            culprit = _plugin_frame(exc)
            if culprit is not None:  # a kernel, model or command of a plugin raised: the plugin's problem
                plugin, where = culprit
                click.echo(f"molpredict: error: plugin {plugin!r} failed: {type(exc).__name__}: {first_line} "
                           f"(at {where}; MOLPREDICT_DEBUG=1 for the traceback)", err=True)
                ctx.exit(PluginError.exit_code)
            click.echo(f"molpredict: internal error: {type(exc).__name__}: {first_line} (a bug: run again with "
                       f"MOLPREDICT_DEBUG=1 for the traceback, and report it)", err=True)
            ctx.exit(1)


@click.group(cls=MolpredictGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="molpredict")
@click.option("--plugins-dir", metavar="DIRECTORY", envvar="MOLPREDICT_PLUGINS_DIR", callback=_check_plugins_dir,
              is_eager=True,
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
