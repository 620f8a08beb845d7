"""``molpredict plugins``: what the registry holds and who provided it."""
from __future__ import annotations

import json

import click

from molpredict.registry import KINDS, get_registry
from molpredict.cli.group import cli


@cli.group()
def plugins() -> None:
    """Inspect plugins: kernels, sketches, models and encoders, built-in or third-party."""


@plugins.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of objects.")
@click.option("--kind", type=click.Choice(list(KINDS)), help="Only this kind.")
def list_plugins(as_json: bool, kind: str | None) -> None:
    """List every registered component with its kind, provider and version."""
    registry = get_registry()
    rows = [{"name": e.name, "kind": e.kind, "provider": e.provider, "version": e.version,
             "target": e.target if isinstance(e.target, str) else f"{e.target.__module__}:{e.target.__qualname__}"}
            for e in registry.entries() if kind is None or e.kind == kind]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    headers = ["kind", "name", "provider", "version"]
    widths = [max([len(h)] + [len(str(r[h])) for r in rows]) for h in headers]
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    for r in rows:
        click.echo("  ".join(str(r[h]).ljust(w) for h, w in zip(headers, widths)))
    for failure in registry.failures:
        click.echo(f"(skipped) {failure}", err=True)
