"""User defaults: the candidate library and model used when a command is not given ``--library`` / ``--model``.

A value comes from, in order: the command line; the environment (``MOLPREDICT_LIBRARY``, ``MOLPREDICT_MODEL``);
the config file, a small JSON object written by ``molpredict config set``; for the model only, the default bundle
``$MOLPREDICT_HOME/models/default``. There is no built-in library: a user says which one once.

The config file is ``$MOLPREDICT_CONFIG`` when set, else ``$MOLPREDICT_HOME/config.json`` when ``MOLPREDICT_HOME``
is set, else ``config.json`` in the user config directory (``platformdirs.user_config_dir("molpredict")``).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from molpredict.errors import InputError

__all__ = ["SETTINGS", "Setting", "config_path", "read_config", "set_value", "unset_value", "resolve",
           "default_library", "default_model", "no_library_message", "show"]


@dataclass(frozen=True)
class Setting:
    """One user default: its config key, environment variable and what it names."""

    key: str
    env: str
    what: str        # "file" or "directory" (a model bundle)
    description: str


SETTINGS: dict[str, Setting] = {
    "library": Setting("library", "MOLPREDICT_LIBRARY", "file",
                       "candidate library (.tsv/.tsv.gz, .smi, .sdf) used when --library is not given"),
    "model": Setting("model", "MOLPREDICT_MODEL", "directory",
                     "model bundle used when --model is not given"),
}


def config_path() -> Path:
    """The config file (it may not exist yet)."""
    explicit = os.environ.get("MOLPREDICT_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("MOLPREDICT_HOME")
    if home:
        return Path(home).expanduser() / "config.json"
    import platformdirs
    return Path(platformdirs.user_config_dir("molpredict")) / "config.json"


def read_config(path: Path | None = None, *, strict: bool = True) -> dict[str, str]:
    """The stored settings (empty when there is no config file); ``strict=False`` drops a setting that is not a
    string instead of raising (what ``unset`` reads, so that it can repair the file).

    Raises
    ------
    InputError
        The file is not a JSON object.
    """
    path = config_path() if path is None else path
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"not a JSON config file ({exc.msg}, line {exc.lineno}); fix or delete it",
                         path=str(path)) from None
    if not isinstance(data, dict):
        raise InputError("not a JSON object; fix or delete it", path=str(path))
    for key, value in data.items():
        if strict and key in SETTINGS and not isinstance(value, str):  # str(None) would be the path "None"
            raise InputError(f"setting {key!r} must be a path in quotes, not {json.dumps(value)}; fix it or "
                             f"`molpredict config unset {key}`", path=str(path))
    return {str(k): v for k, v in data.items() if k in SETTINGS and isinstance(v, str)}


def _setting(key: str) -> Setting:
    try:
        return SETTINGS[key]
    except KeyError:
        raise InputError(f"unknown setting {key!r} (expected one of: {', '.join(SETTINGS)})") from None


def _write(values: dict[str, str]) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def set_value(key: str, value: str) -> Path:
    """Store ``key`` (``library`` or ``model``) as the absolute path ``value``; returns the config file.

    Raises
    ------
    InputError
        Unknown key, or ``value`` is not an existing file (library) / directory (model).
    """
    setting = _setting(key)
    path = Path(value).expanduser().resolve()
    exists = path.is_file() if setting.what == "file" else path.is_dir()
    if not exists:
        if setting.what == "file" and path.is_dir():
            raise InputError(f"is a directory, not a {key} file", path=str(path))
        if setting.what == "directory" and path.exists():
            raise InputError(f"is a file, not a {key} bundle directory", path=str(path))
        raise InputError(f"no such {setting.what} (the {key} must exist)", path=str(path))
    values = read_config()
    values[key] = str(path)
    return _write(values)


def unset_value(key: str) -> tuple[Path, bool]:
    """Remove ``key`` from the config file; returns the file and whether ``key`` was in it (a second unset must
    not read as having removed something)."""
    _setting(key)
    path = config_path()
    values = read_config(path, strict=False)
    # a value that is not a string (dropped by strict=False) was set too: removing it is what repairs the file
    was_set = key in values or key in _stored_keys(path)
    values.pop(key, None)
    return _write(values), was_set


def _stored_keys(path: Path) -> set[str]:
    """The keys of the config file's JSON object (empty when there is none; :func:`read_config` has refused a
    file that is not one)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, json.JSONDecodeError):
        return set()
    return set(data) if isinstance(data, dict) else set()


def resolve(key: str) -> tuple[str | None, str]:
    """``(value, origin)`` of a setting without a command-line value; origin is ``"environment (VAR)"``,
    ``"config file"``, ``"default"`` or ``"unset"``."""
    setting = _setting(key)
    env = os.environ.get(setting.env)
    if env:
        return env, f"environment ({setting.env})"
    stored = read_config().get(key)
    if stored:
        return stored, "config file"
    if key == "model":
        from molpredict.modelfile import default_bundle_path
        return str(default_bundle_path()), "default"
    return None, "unset"


def default_library() -> str | None:
    """The library to use when ``--library`` is not given, or None when the user has not set one."""
    return resolve("library")[0]


def default_model() -> str:
    """The model bundle to use when ``--model`` is not given (the default bundle when none is set)."""
    value = resolve("model")[0]
    assert value is not None
    return value


def no_library_message() -> str:
    """The one-line error for a command that needs a library and has none."""
    return ("no candidate library: give --library LIB, or set a default once with "
            "`molpredict config set library LIB` (or MOLPREDICT_LIBRARY=LIB); build one with "
            "`molpredict candidates build`")


def show() -> dict:
    """Every setting with its value and origin, and the config file (JSON-serialisable)."""
    out: dict = {"config_file": str(config_path())}
    for key, setting in SETTINGS.items():
        value, origin = resolve(key)
        out[key] = {"value": value, "origin": origin, "env": setting.env, "description": setting.description}
    return out
