"""``molpredict config``: show and set the user defaults (library, model); see :mod:`molpredict.config`."""
from __future__ import annotations

import json

import click

from molpredict.cli.group import cli

__all__ = ["config_group"]


@cli.group("config")
def config_group() -> None:
    """Defaults used when --library / --model are not given (env MOLPREDICT_LIBRARY / MOLPREDICT_MODEL win)."""


@config_group.command("set")
@click.argument("key", type=click.Choice(["library", "model"]))
@click.argument("value", type=click.Path())
def config_set(key: str, value: str) -> None:
    """Store KEY (library: a library file; model: a bundle directory) as an absolute path.

    \b
    Examples:
      molpredict config set library ~/data/pool.tsv.gz
      molpredict config set model ~/models/massbank
    """
    from pathlib import Path

    from molpredict.config import read_config, set_value
    from molpredict.errors import InputError

    # what it names must be usable, or every later `identify` fails with a message about another file
    if key == "model" and Path(value).is_dir():
        from molpredict.modelfile import BUNDLE_FILE
        if not (Path(value) / BUNDLE_FILE).is_file():
            raise InputError(f"not a model bundle (no {BUNDLE_FILE}): train one with `molpredict train`", path=value)
    if key == "library" and Path(value).is_file():
        from molpredict.chem.candidates import check_library_file
        check_library_file(value)
    path = set_value(key, value)
    click.echo(f"molpredict: {key} = {read_config()[key]} (saved in {path})", err=True)


@config_group.command("unset")
@click.argument("key", type=click.Choice(["library", "model"]))
def config_unset(key: str) -> None:
    """Forget the stored KEY."""
    import os

    from molpredict.config import SETTINGS, unset_value

    path, was_set = unset_value(key)
    # the environment wins over the file: unsetting the file's value leaves that one in force
    env = SETTINGS[key].env
    still = f"; {env} from the environment still applies" if os.environ.get(env) else ""
    if was_set:
        click.echo(f"molpredict: {key} unset (in {path}){still}", err=True)
    else:
        click.echo(f"molpredict: {key} was not set in {path}: nothing to unset{still}", err=True)


@config_group.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def config_show(as_json: bool) -> None:
    """Print each setting, its value and where it comes from (environment, config file, default, unset)."""
    from molpredict.config import SETTINGS, show

    info = show()
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    lines = [f"config file: {info['config_file']}"]
    for key in SETTINGS:
        entry = info[key]
        value = entry["value"] if entry["value"] is not None else f"(not set: `molpredict config set {key} ...` " \
                                                                   f"or {entry['env']})"
        lines.append(f"{key}: {value}  [{entry['origin']}]")
    click.echo("\n".join(lines))
