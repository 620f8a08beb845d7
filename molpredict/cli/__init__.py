"""The ``molpredict`` command line: a thin click layer over the library (no math here).

Every :class:`molpredict.errors.MolpredictError` becomes one line on stderr and the error's exit code.
Command groups live in one module each (``molpredict/cli/<topic>.py``) and attach themselves to ``cli``.
"""
from __future__ import annotations

import os
import sys

import click

from molpredict.errors import MolpredictError
from molpredict.cli.group import cli, plugins_dir_problem

__all__ = ["cli", "main"]


def _preset_plugins_dir(argv: list[str]) -> str | None:
    """Honour ``--plugins-dir`` before the registry is built (plugins may add commands); its value, if given."""
    given = None
    for i, arg in enumerate(argv):
        if arg == "--plugins-dir" and i + 1 < len(argv):
            given = argv[i + 1]
        elif arg.startswith("--plugins-dir="):
            given = arg.split("=", 1)[1]
    if given is not None:
        os.environ["MOLPREDICT_PLUGINS_DIR"] = given
    return given


# Command modules attach their commands to ``cli`` (from .group) on import.
from molpredict.cli import plugins  # noqa: E402,F401
from molpredict.cli import spectra  # noqa: E402,F401
from molpredict.cli import candidates  # noqa: E402,F401
from molpredict.cli import identification  # noqa: E402,F401
from molpredict.cli import dsokr  # noqa: E402,F401
from molpredict.cli import config  # noqa: E402,F401
from molpredict.cli import report  # noqa: E402,F401
from molpredict.cli import properties  # noqa: E402,F401


def _add_plugin_commands() -> None:
    from molpredict.registry import get_registry
    try:
        get_registry().register_commands(cli)
    except MolpredictError as exc:
        click.echo(f"molpredict: error: {exc}", err=True)
        sys.exit(exc.exit_code)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    import warnings

    from molpredict.errors import one_line_warning

    warnings.showwarning = one_line_warning  # the command line's process only: the library's callers keep theirs
    argv = list(sys.argv[1:] if argv is None else argv)
    given = _preset_plugins_dir(argv)
    directory = os.environ.get("MOLPREDICT_PLUGINS_DIR")
    # before the registry reads it, so that the error is the one message (not the registry's warning, then this)
    problem = plugins_dir_problem(directory or "", from_option=given is not None)
    if problem is not None:
        click.echo(f"molpredict: error: {problem}", err=True)
        sys.exit(2)
    _add_plugin_commands()
    cli.main(args=argv, prog_name="molpredict")

