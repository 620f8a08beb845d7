"""``molpredict plugins``: what the registry holds and who provided it."""
from __future__ import annotations

import json

import click

from molpredict.registry import BUILTIN_PROVIDER, KINDS, get_registry
from molpredict.cli.group import cli

#: the kinds ``plugins list --kind`` takes: the registry's, and the commands plugins add
LIST_KINDS = list(KINDS) + ["command"]


def _kinds_text() -> str:
    """Every kind ``plugins list`` shows, in words (``input kernels, ..., regressors and commands``): built from
    :data:`LIST_KINDS`, so that a kind the registry gains is never left out of the help."""
    words = [kind.replace("_", " ") + ("es" if kind.endswith(("sh", "ch")) else "s") for kind in LIST_KINDS]
    return ", ".join(words[:-1]) + " and " + words[-1]


@cli.group(help=f"Inspect plugins: the {_kinds_text()} they provide, built-in or third-party.")
def plugins() -> None:
    """Inspect plugins (the help text lists every kind the registry has)."""


def _target(obj) -> str:
    return obj if isinstance(obj, str) else f"{obj.__module__}:{getattr(obj, '__qualname__', type(obj).__name__)}"


def _rows(registry, kind: str | None) -> list[dict]:
    """One row per component (and per plugin command), with the provider, its version and where it came from."""
    rows = [{"name": e.name, "kind": e.kind, "provider": e.provider, "version": e.version,
             "origin": registry.origin(e.provider), "target": _target(e.target)}
            for e in registry.entries() if kind is None or e.kind == kind]
    if kind in (None, "command"):
        root = click.get_current_context().find_root().command
        for name, provider in sorted(registry.commands.items()):
            command = root.commands.get(name) if hasattr(root, "commands") else None
            rows.append({"name": name, "kind": "command", "provider": provider,
                         "version": registry.providers().get(provider), "origin": registry.origin(provider),
                         "target": _target(getattr(command, "callback", None) or name)})
    return rows


@plugins.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of objects.")
@click.option("--kind", type=click.Choice(LIST_KINDS), help="Only this kind.")
def list_plugins(as_json: bool, kind: str | None) -> None:
    """List every registered component and plugin command with its kind, provider and version, then where each
    third-party plugin came from (entry point or plugins-directory file) and the plugins skipped."""
    registry = get_registry()
    rows = _rows(registry, kind)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    headers = ["kind", "name", "provider", "version"]
    widths = [max([len(h)] + [len(str(r[h])) for r in rows]) for h in headers]
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    for r in rows:
        click.echo("  ".join(str(r[h]).ljust(w) for h, w in zip(headers, widths)))
    external = sorted({r["provider"] for r in rows} - {BUILTIN_PROVIDER})
    if external:
        click.echo("")
        for provider in external:
            click.echo(f"plugin {provider} {registry.providers().get(provider)}: {registry.origin(provider)}")
    for failure in registry.failures:
        click.echo(f"(skipped) {failure}", err=True)
