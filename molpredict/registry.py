"""The plugin registry: one pluggy manager that collects input kernels, output kernels, sketches, models and
encoders from the built-ins, from installed entry points (group ``molpredict``) and from a directory of
``*.py`` plugin files.

Environment
-----------
MOLPREDICT_LOAD_PLUGINS
    Comma-separated names of the external plugins to load (entry-point names or plugin-file stems). Unset:
    all; empty string: none (the test suite sets this so installed plugins never leak into tests).
MOLPREDICT_BLOCK_PLUGINS
    Comma-separated names of external plugins never to load.
MOLPREDICT_PLUGINS_DIR
    A directory of ``*.py`` plugin files (the CLI's ``--plugins-dir`` sets it). Read when the process-wide registry
    is built (at its first use): from Python, call :func:`load_plugins` instead of setting it later.
MOLPREDICT_STRICT_PLUGINS
    ``1``: a plugin that fails to load is a fatal error instead of a one-line warning.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import importlib.abc
import inspect
import os
import sys
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import pluggy

from molpredict import hookspecs
from molpredict.errors import PluginError, SpecError
from molpredict.specs import ComponentSpec, nested_spec, parse_spec

__all__ = [
    "BASES",
    "KINDS",
    "Entry",
    "alias_class",
    "check_component_class",
    "PluginFailure",
    "Registry",
    "get_registry",
    "reset_registry",
    "load_plugins",
    "load_hint",
    "create",
    "PLUGIN_MODULE_PREFIX",
    "plugin_files",
    "find_plugin_files",
]

#: kind -> hook name. The order is the order of ``plugins list``.
KINDS: dict[str, str] = {
    "input_kernel": "register_input_kernels",
    "output_kernel": "register_output_kernels",
    "sketch": "register_sketches",
    "model": "register_models",
    "encoder": "register_encoders",
    "regressor": "register_regressors",
}
BUILTIN_PROVIDER = "molpredict"
ENTRY_POINT_GROUP = "molpredict"
#: a plugins-directory file ``NAME.py`` is imported as the module ``molpredict_plugin_NAME``
PLUGIN_MODULE_PREFIX = "molpredict_plugin_"


#: kind -> (the base class its components subclass, as a lazy "module:Class", and the name plugin authors import)
BASES: dict[str, tuple[str, str]] = {
    "input_kernel": ("molpredict.kernels.base:InputKernel", "molpredict.kernels.InputKernel"),
    "output_kernel": ("molpredict.kernels.base:OutputKernel", "molpredict.kernels.OutputKernel"),
    "sketch": ("molpredict.engine.sketches:Sketch", "molpredict.engine.sketches.Sketch"),
    "model": ("molpredict.models.base:Model", "molpredict.models.base.Model"),
    "encoder": ("molpredict.engine.encoders:Encoder", "molpredict.engine.encoders.Encoder"),
    "regressor": ("molpredict.models.regression:Regressor", "molpredict.models.regression.Regressor"),
}


def _describe(component: Any) -> str:
    if inspect.isclass(component):
        return f"class {component.__module__}.{component.__qualname__}"
    return f"a {type(component).__name__}"


def check_component_class(kind: str, component: Any, imported_only: bool = False) -> str | None:
    """Why ``component`` cannot be a ``kind`` (one line), or None when it is a subclass of the kind's base class.

    Parameters
    ----------
    imported_only : bool
        Do not import the base class's module (registration must not import torch for an encoder): a class can
        only subclass a base whose module is already imported, so an unimported base means "not a subclass".
    """
    module_name, _, attr = BASES[kind][0].partition(":")
    module = sys.modules.get(module_name) if imported_only else importlib.import_module(module_name)
    base = getattr(module, attr, None)
    if inspect.isclass(component) and base is not None and issubclass(component, base):
        return None
    return f"{_describe(component)} is not a subclass of {BASES[kind][1]}"


#: (class, registry name) -> the thin subclass carrying that name (one per alias, so identity is stable)
_ALIASES: dict[tuple[type, str], type] = {}


def alias_class(cls: type, name: str) -> type:
    """A subclass of ``cls`` that only sets ``registry_name = name``: the class of a second registry name for a
    class that another entry names (its ``registry_name`` belongs to that entry). It pickles and copies as
    itself (rebuilt by :func:`alias_class` on the other side), so kernel worker processes keep the name."""
    key = (cls, name)
    if key not in _ALIASES:
        def body(namespace: dict) -> None:
            namespace.update({"registry_name": name, "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                              "__doc__": cls.__doc__, "_aliased_class": cls, "__reduce_ex__": _reduce_alias})
        import types
        _ALIASES[key] = types.new_class(cls.__name__, (cls,), exec_body=body)
    return _ALIASES[key]


def _new_alias_instance(cls: type, name: str) -> Any:
    alias = alias_class(cls, name)
    return alias.__new__(alias)


def _reduce_alias(self: Any, protocol: int) -> tuple:
    # by reference the alias would resolve to the aliased class (same module and qualname): rebuild it instead
    cls = type(self)
    state = self.__getstate__() if hasattr(self, "__getstate__") else self.__dict__
    return _new_alias_instance, (cls._aliased_class, cls.registry_name), state


def _owns_name(entry: "Entry", cls: type) -> bool:
    """Whether ``entry`` may write its name on ``cls`` itself: the class carries no other name, and a plugin
    never names a built-in class (a model trained with the built-in must record the built-in's name)."""
    own = cls.__dict__.get("registry_name")
    if own is not None:
        return own == entry.name
    return entry.provider == BUILTIN_PROVIDER or cls.__module__.split(".")[0] != "molpredict"


@dataclass
class Entry:
    """One registered component.

    Attributes
    ----------
    name, kind : str
        Registry name and kind (a key of :data:`KINDS`).
    provider : str
        The plugin that registered it (``molpredict`` for built-ins).
    version : str
        The provider's version.
    target : type or str
        The class, or a lazy ``"package.module:ClassName"`` reference imported on first use.
    """

    name: str
    kind: str
    provider: str
    version: str
    target: Any
    _loaded: Any = field(default=None, repr=False)

    def load(self) -> type:
        """The component class (imported on first use), whose ``registry_name`` is this entry's name.

        A class that another entry already names (a plugin's alias of a built-in class, or one class registered
        under two names) is returned as a thin subclass carrying this name (:func:`alias_class`), so that the
        name of one entry is never written over another's.

        Raises
        ------
        PluginError
            A lazy target cannot be imported, or is not a subclass of the kind's base class.
        """
        if self._loaded is None:
            target = self.target
            if isinstance(target, str):
                module_name, _, attr = target.partition(":")
                try:
                    target = getattr(importlib.import_module(module_name), attr)
                except (ImportError, AttributeError) as exc:
                    raise PluginError(
                        f"{self.kind} {self.name!r} from plugin {self.provider!r} could not be loaded "
                        f"({target}): {exc}") from exc
                problem = check_component_class(self.kind, target)
                if problem is not None:
                    raise PluginError(f"{self.kind} {self.name!r} from plugin {self.provider!r} ({self.target}): "
                                      f"{problem}")
            if _owns_name(self, target):
                target.registry_name = self.name
            else:
                target = alias_class(target, self.name)
            self._loaded = target
        return self._loaded


@dataclass
class PluginFailure:
    """A plugin that could not be loaded or registered, with the reason in one line."""

    plugin: str
    reason: str

    def __str__(self) -> str:
        return f"plugin {self.plugin!r} skipped: {self.reason}"


def _env_list(name: str) -> list[str] | None:
    value = os.environ.get(name)
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


def _returned(hook_name: str, result: Any) -> str:
    return (f"hook {hook_name} returned {_describe(result)}, which is ignored: a hook registers by calling "
            f"register(name, cls) (or cli.command) and returns None")


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return " ".join(text.split())


def plugin_files() -> dict[str, str]:
    """Module name -> file of every plugins-directory module imported in this process (by any :class:`Registry`).

    A component of such a module pickles by reference to ``molpredict_plugin_NAME``, a name no other process can
    import by itself: a process that unpickles one (a kernel's row worker) first calls :func:`find_plugin_files`
    with this mapping.
    """
    return {name: module.__file__ for name, module in list(sys.modules.items())
            if name.startswith(PLUGIN_MODULE_PREFIX) and getattr(module, "__file__", None)}


class _PluginFileFinder(importlib.abc.MetaPathFinder):
    """Imports ``molpredict_plugin_NAME`` from its plugins-directory file, as :class:`Registry` does."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = dict(files)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        file = self.files.get(fullname)
        return None if file is None else importlib.util.spec_from_file_location(fullname, file)


def find_plugin_files(files: dict[str, str]) -> None:
    """Make the plugins-directory modules of :func:`plugin_files` (another process's) importable here by name.

    Each is imported from its file on first use only (unpickling a component of it), so a plugin file that the
    pickled objects do not need is never run.
    """
    for finder in sys.meta_path:
        if isinstance(finder, _PluginFileFinder):
            finder.files.update(files)
            return
    sys.meta_path.append(_PluginFileFinder(files))


def _text_only(parameter: inspect.Parameter, hints: dict[str, Any]) -> tuple[bool, bool]:
    """``(takes text only, takes None too)`` for one ``__init__`` parameter: annotated ``str`` (or ``str | None``),
    or, unannotated, with a ``str`` default (None is then taken as well: ``none`` may mean "no value")."""
    hint = hints.get(parameter.name, parameter.annotation)
    if hint is inspect.Parameter.empty:
        return isinstance(parameter.default, str), True
    if isinstance(hint, str):  # an annotation typing could not resolve: read the common spellings
        hint = hint.replace(" ", "")
        if hint == "str":
            return True, False
        return hint in ("str|None", "None|str", "Optional[str]", "typing.Optional[str]"), True
    if hint is str:
        return True, False
    args = set(typing.get_args(hint))
    return (type(None) in args and args - {type(None)} == {str}), True


def _as_text(cls: type, spec: ComponentSpec) -> dict[str, Any]:
    """The parameters of ``spec`` with the value of each that ``cls`` takes as text only replaced by the text it
    was parsed from: ``mode=inf`` gives a string parameter ``"inf"``, not float inf (nor ``true`` True, ``1e3``
    1000.0). A number parameter keeps the parsed value, and a spec not parsed from text (no texts) is unchanged."""
    if not spec.texts:
        return dict(spec.params)
    try:
        parameters = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return dict(spec.params)
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # an annotation that does not resolve (a name under TYPE_CHECKING): the raw strings
        hints = {}
    params = dict(spec.params)
    for key, value in spec.params.items():
        if isinstance(value, str) or key not in spec.texts or key not in parameters:
            continue
        text_only, takes_none = _text_only(parameters[key], hints)
        if text_only and not (value is None and takes_none):
            params[key] = spec.texts[key]
    return params


class Registry:
    """Name -> component maps per kind, built from a pluggy plugin manager.

    Use :func:`get_registry` for the process-wide instance; construct one directly in tests.

    Parameters
    ----------
    plugins_dir : str or Path, optional
        A directory of ``*.py`` plugin files (default: ``MOLPREDICT_PLUGINS_DIR``).
    load_external : bool
        Load entry points and the plugins directory (subject to the allow/block lists).
    strict : bool, optional
        Raise on a failing plugin (default: ``MOLPREDICT_STRICT_PLUGINS=1``).
    extra_plugins : iterable, optional
        Plugin objects (modules or instances with hook implementations) registered after the built-ins.
    """

    def __init__(self, plugins_dir: str | os.PathLike | None = None, load_external: bool = True,
                 strict: bool | None = None, extra_plugins: Iterable[Any] = ()) -> None:
        self.strict = os.environ.get("MOLPREDICT_STRICT_PLUGINS", "") == "1" if strict is None else strict
        #: whether the plugins directory was read from MOLPREDICT_PLUGINS_DIR (see :meth:`stale_plugins_dir`)
        self._dir_from_env = plugins_dir is None
        self.plugins_dir = plugins_dir if plugins_dir is not None else (
            os.environ.get("MOLPREDICT_PLUGINS_DIR") or None)
        self.failures: list[PluginFailure] = []
        #: one-line warnings about plugins that loaded (a hook that returned a value, a refused command)
        self.warnings: list[str] = []
        #: command name -> the plugin that added it (by :meth:`register_commands`)
        self.commands: dict[str, str] = {}
        self._entries: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}
        self._versions: dict[str, str] = {}
        self._origins: dict[str, str] = {}
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        for name in _env_list("MOLPREDICT_BLOCK_PLUGINS") or []:
            self.pm.set_blocked(name)

        from molpredict import __version__, builtins
        self._add_plugin(builtins, BUILTIN_PROVIDER, __version__, "built-in")
        if load_external:
            self._load_entry_points()
            if self.plugins_dir:
                self._load_directory(Path(self.plugins_dir))
        for i, plugin in enumerate(extra_plugins):
            name = getattr(plugin, "__name__", None) or f"{type(plugin).__name__}-{i}"
            self._add_plugin(plugin, name, getattr(plugin, "__version__", "local"), "in-process")

    # -- loading ---------------------------------------------------------------------------------------
    def _fail(self, plugin: str, reason: str) -> None:
        failure = PluginFailure(plugin, reason)
        if self.strict:  # not "skipped": nothing goes on
            raise PluginError(f"plugin {plugin!r} failed (MOLPREDICT_STRICT_PLUGINS=1): {reason}")
        self.failures.append(failure)
        print(f"molpredict: warning: {failure}", file=sys.stderr)

    def _skip(self, plugin: str, reason: str) -> None:
        """Skip a plugin whole: forget what it had registered, then report it (fatal in strict mode)."""
        self._drop(plugin)
        self._fail(plugin, reason)

    def _warn(self, plugin: str, message: str) -> None:
        text = f"plugin {plugin!r}: {message}"
        self.warnings.append(text)
        print(f"molpredict: warning: {text}", file=sys.stderr)

    def _wanted(self, name: str) -> bool:
        allow = _env_list("MOLPREDICT_LOAD_PLUGINS")
        return (allow is None or name in allow) and not self.pm.is_blocked(name)

    def _load_entry_points(self) -> None:
        if os.environ.get("MOLPREDICT_LOAD_PLUGINS") == "":
            return
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if not self._wanted(ep.name):
                continue
            if self.pm.has_plugin(ep.name):
                self._fail(f"{ep.name} = {ep.value}", f"its name {ep.name!r} is taken by the plugin from "
                                                     f"{self._origins.get(ep.name, 'elsewhere')}")
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken plugin must never break unrelated commands
                self._fail(ep.name, f"import failed: {_one_line(exc)}")
                continue
            version = ep.dist.version if ep.dist is not None else "unknown"
            dist = f" (distribution {ep.dist.name} {version})" if ep.dist is not None else ""
            self._add_plugin(plugin, ep.name, version, f"entry point {ep.name} = {ep.value}{dist}")

    def _load_directory(self, directory: Path) -> None:
        if not directory.is_dir():
            # the variable may be set for every shell: a warning naming it, not an error (--plugins-dir is one)
            source = " (MOLPREDICT_PLUGINS_DIR)" if self._dir_from_env else ""
            what = "is not a directory" if directory.exists() else "does not exist"
            self._fail(str(directory), f"plugins directory{source} {what}")
            return
        for path in sorted(directory.glob("*.py")):
            name = path.stem
            if name.startswith("_") or not self._wanted(name):
                continue
            if self.pm.has_plugin(name):  # an entry point of the same name: say which one is used
                self._fail(str(path), f"its name {name!r} is taken by the plugin from "
                                      f"{self._origins.get(name, 'elsewhere')}")
                continue
            module_name = f"{PLUGIN_MODULE_PREFIX}{name}"
            try:
                spec = importlib.util.spec_from_file_location(module_name, path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[module_name] = module
                spec.loader.exec_module(module)
            except Exception as exc:
                sys.modules.pop(module_name, None)
                self._fail(name, f"import of {path} failed: {_one_line(exc)}")
                continue
            self._add_plugin(module, name, str(getattr(module, "__version__", "local")), str(path))

    def _add_plugin(self, plugin: Any, name: str, version: str, origin: str) -> None:
        try:
            self.pm.register(plugin, name=name)
        except Exception as exc:
            self._fail(name, f"registration failed: {_one_line(exc)}")
            return
        misspelled = self._unknown_hooks(name)
        if misspelled:
            self.pm.unregister(name=name)
            self._fail(name, "unknown hook(s) " + ", ".join(misspelled) + " (misspelled? valid hooks: "
                       + ", ".join(list(KINDS.values()) + ["register_commands"]) + ")")
            return
        self._versions[name] = version
        self._origins[name] = origin
        for hook_name in self._unmarked_hooks(plugin):
            self._warn(name, f"{hook_name} has no @hookimpl decorator: it is not called")
        for kind, hook_name in KINDS.items():
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                if impl.plugin_name == name and not self._call_hook(impl, kind, name, version):
                    return

    def _call_hook(self, impl: Any, kind: str, name: str, version: str) -> bool:
        """Run one registration hook of plugin ``name``; False when the plugin was skipped (whole)."""
        hook_name = KINDS[kind]
        try:
            result = impl.function(register=self._registrar(kind, name, version))
        except Exception as exc:
            if name == BUILTIN_PROVIDER:  # a bug in molpredict itself: never hidden as a skipped plugin
                raise
            # a third-party plugin that registers badly is skipped whole, as one that fails to import, the
            # components it registered before included: it must not break the commands that do not use it
            reason = str(exc) if isinstance(exc, (PluginError, SpecError)) else (
                f"hook {hook_name} raised {_one_line(exc)}")
            self._skip(name, reason)
            return False
        if result is not None:
            self._warn(name, _returned(hook_name, result))
        return True

    @staticmethod
    def _unmarked_hooks(plugin: Any) -> list[str]:
        """Functions of ``plugin`` named like a hook but without ``@hookimpl`` (pluggy ignores them silently)."""
        marker = f"{hookspecs.PROJECT_NAME}_impl"
        names = list(KINDS.values()) + ["register_commands"]
        return [hook for hook in names
                if callable(getattr(plugin, hook, None)) and not hasattr(getattr(plugin, hook), marker)]

    def _drop(self, plugin_name: str) -> None:
        """Forget a plugin: its registered components, commands and hook implementations."""
        for entries in self._entries.values():
            for key in [k for k, entry in entries.items() if entry.provider == plugin_name]:
                del entries[key]
        for command in [c for c, owner in self.commands.items() if owner == plugin_name]:
            del self.commands[command]
        self._versions.pop(plugin_name, None)
        self._origins.pop(plugin_name, None)
        if self.pm.has_plugin(plugin_name):
            self.pm.unregister(name=plugin_name)

    def _unknown_hooks(self, plugin_name: str) -> list[str]:
        """Hook implementations of ``plugin_name`` that match no hook spec (pluggy's check_pending, per plugin)."""
        unknown = []
        for hook_name in dir(self.pm.hook):
            if hook_name.startswith("_"):
                continue
            caller = getattr(self.pm.hook, hook_name)
            if getattr(caller, "has_spec", lambda: True)():
                continue
            if any(impl.plugin_name == plugin_name for impl in caller.get_hookimpls()):
                unknown.append(hook_name)
        return unknown

    def _registrar(self, kind: str, provider: str, version: str):
        """The ``register(name, component)`` callback given to ``provider``'s hook of ``kind``. A mistake raises
        :class:`PluginError` (the caller skips the plugin whole); a lazy target's class is checked when loaded."""
        def register(name: str, component: Any) -> None:
            if not isinstance(name, str) or not name:
                raise PluginError(f"registered a {kind} without a name")
            if not (isinstance(component, str) and ":" in component):
                if not inspect.isclass(component):
                    raise PluginError(f"{kind} {name!r} must be a class or 'module:Class', not "
                                      f"{_describe(component)}")
                problem = check_component_class(kind, component, imported_only=True)
                if problem is not None:
                    raise PluginError(f"{kind} {name!r}: {problem}")
            existing = self._entries[kind].get(name)
            if existing is not None:
                raise PluginError(f"{kind} {name!r} registered twice: by {existing.provider!r} and by {provider!r}")
            self._entries[kind][name] = Entry(name, kind, provider, version, component)
        return register

    # -- queries ---------------------------------------------------------------------------------------
    def names(self, kind: str) -> list[str]:
        """Registered names of one kind, sorted."""
        self._check_kind(kind)
        return sorted(self._entries[kind])

    def entries(self) -> list[Entry]:
        """Every registered component, by kind then name."""
        return [self._entries[kind][name] for kind in KINDS for name in sorted(self._entries[kind])]

    def entry(self, kind: str, name: str) -> Entry:
        self._check_kind(kind)
        try:
            return self._entries[kind][name]
        except KeyError:
            valid = ", ".join(self.names(kind)) or "(none)"
            raise SpecError(f"unknown {kind.replace('_', ' ')} {name!r}; valid names: {valid}"
                            f"{self._stale_hint()}") from None

    def stale_plugins_dir(self) -> str | None:
        """The directory MOLPREDICT_PLUGINS_DIR names now when this registry read another value of it (it was set
        after the registry was built, which does not read it again), else None."""
        now = os.environ.get("MOLPREDICT_PLUGINS_DIR") or None
        if not self._dir_from_env or now is None or now == (str(self.plugins_dir) if self.plugins_dir else None):
            return None
        return now

    def _stale_hint(self) -> str:
        stale = self.stale_plugins_dir()
        if stale is None:
            return ""
        return (f" (MOLPREDICT_PLUGINS_DIR={stale} was set after the plugin registry was built and is not read "
                f"again: call molpredict.load_plugins({stale!r}))")

    def entry_of(self, cls: type, kinds: Sequence[str] = tuple(KINDS)) -> Entry | None:
        """The entry whose class is ``cls`` among ``kinds`` (in that order), or None: first by the name the class
        carries (``registry_name``, set on the class an entry loaded; a subclass inheriting it is not that class),
        else by comparing every entry's class."""
        own = cls.__dict__.get("registry_name")
        for kind in kinds:
            if own in self._entries[kind] and self._entries[kind][own].load() is cls:
                return self._entries[kind][own]
        for kind in kinds:
            for name in self.names(kind):
                if self._entries[kind][name].load() is cls:
                    return self._entries[kind][name]
        return None

    def get(self, kind: str, name: str) -> type:
        """The class registered as ``name`` under ``kind``.

        Raises
        ------
        SpecError
            Unknown name (the message lists the valid ones).
        """
        return self.entry(kind, name).load()

    def check_names(self, kind: str, name: str, params: Any = ()) -> tuple[type, list[str]]:
        """``(class, its parameter names)`` of the component ``name``, or the :class:`SpecError` naming an unknown
        name or an unknown parameter among ``params`` (names; values are checked when it is built)."""
        cls = self.get(kind, name)
        valid = cls.param_names() if hasattr(cls, "param_names") else list(
            inspect.signature(cls.__init__).parameters)[1:]
        unknown = sorted(set(params) - set(valid))
        if unknown:
            raise SpecError(f"{kind.replace('_', ' ')} {name!r} has no parameter(s) {', '.join(unknown)}; "
                            f"valid: {', '.join(valid) or '(none)'}")
        return cls, list(valid)

    def create(self, kind: str, spec: "str | ComponentSpec", **overrides: Any) -> Any:
        """Instantiate a component from a spec; ``overrides`` fill parameters the spec does not set."""
        spec = parse_spec(spec)
        if spec.is_grid:
            raise SpecError(f"{spec} is a grid; choose one value (or let the model search it on validation data)")
        cls, valid = self.check_names(kind, spec.name, spec.params)
        params = {k: v for k, v in overrides.items() if k in valid}
        params.update(_as_text(cls, spec))
        try:
            return cls(**params)
        except (TypeError, ValueError) as exc:
            raise SpecError(f"{spec}: {exc}") from exc

    def input_type(self, kind: str, spec: "str | ComponentSpec") -> str | None:
        """What the component named by ``spec`` takes (``spectrum``, ``text``, ...), or None when unknown.

        This is the one place where an input type is worked out: a class attribute ``input_type``, or, for a
        class whose input type depends on its parameters (a property, e.g. ``kernel-mlp``: its kernel's), that of
        the instance built from ``spec``. Specs nested in another spec (``;`` for ``,``) are accepted; a grid
        ``a|b`` takes text when any alternative does. Unregistered names and invalid parameters give None
        (loading or building the component reports them).
        """
        try:
            names = parse_spec(nested_spec(spec)).name.split("|")
        except SpecError:
            return None
        found: str | None = None
        for name in names:
            try:
                cls = self.get(kind, name.strip())
                value = getattr(cls, "input_type", None)
                if isinstance(value, property):
                    value = self.create(kind, nested_spec(spec)).input_type
            except Exception:  # reported where the component is built, not here
                continue
            if value == "text" or found is None:
                found = value
        return found

    def providers(self) -> dict[str, str]:
        """Plugin name -> version, for every plugin that registered successfully."""
        return dict(self._versions)

    def origin(self, plugin: str) -> str | None:
        """Where plugin ``plugin`` was loaded from: ``built-in``, ``entry point NAME = MODULE (distribution D V)``,
        the path of a plugins-directory file, or ``in-process``; None for a plugin that is not loaded."""
        return self._origins.get(plugin)

    def register_commands(self, cli: Any) -> None:
        """Let every plugin add its click commands to ``cli``; a failing plugin is reported and skipped whole.

        A command whose name is taken (a built-in command, or an earlier plugin's) is refused with a one-line
        warning: the command that was there is kept, so a plugin cannot replace ``identify``.
        """
        for impl in self.pm.hook.register_commands.get_hookimpls():
            plugin = impl.plugin_name
            before = dict(cli.commands)
            try:
                result = impl.function(cli=cli)
            except PluginError:
                raise
            except Exception as exc:
                cli.commands.clear()
                cli.commands.update(before)
                self._skip(plugin, f"hook register_commands raised {_one_line(exc)}")
                continue
            for command, obj in list(cli.commands.items()):
                if command not in before:
                    self.commands[command] = plugin
                elif before[command] is not obj:
                    cli.commands[command] = before[command]
                    owner = self.commands.get(command)
                    kept = f"plugin {owner!r}'s" if owner else "the built-in"
                    self._warn(plugin, f"command {command!r} not added: {kept} command of that name is kept")
            if result is not None:
                self._warn(plugin, _returned("register_commands", result))

    @staticmethod
    def _check_kind(kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown component kind {kind!r}; valid: {', '.join(KINDS)}")


_REGISTRY: Registry | None = None


#: MOLPREDICT_PLUGINS_DIR values set after the process-wide registry was built that were warned about (once each)
_WARNED_STALE: set[str] = set()


def get_registry() -> Registry:
    """The process-wide registry, built on first use (reading MOLPREDICT_PLUGINS_DIR then, not later: see
    :func:`load_plugins`)."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = Registry()
    stale = _REGISTRY.stale_plugins_dir()
    if stale is not None and stale not in _WARNED_STALE:
        # a script that sets the variable after its first call would otherwise only hear "not registered"
        _WARNED_STALE.add(stale)
        warnings.warn(f"MOLPREDICT_PLUGINS_DIR={stale} was set after the plugin registry was built and is not "
                      f"read again; call molpredict.load_plugins({stale!r}) to load its plugins", UserWarning,
                      stacklevel=2)
    return _REGISTRY


def reset_registry(registry: Registry | None = None) -> None:
    """Drop (or replace) the process-wide registry; the next :func:`get_registry` rebuilds it.

    Parameters
    ----------
    registry : Registry, optional
        The registry to use from now on (a test's); None: rebuild from the environment at the next use.
    """
    global _REGISTRY
    _REGISTRY = registry


def load_plugins(directory: str | os.PathLike | None = None) -> Registry:
    """Rebuild the process-wide registry now: the built-ins, the installed entry points and the plugin files of
    ``directory``, as ``molpredict --plugins-dir DIRECTORY`` does.

    The registry is built at the first call that needs it and reads MOLPREDICT_PLUGINS_DIR then only: call this
    to load a plugins directory from Python at any time (components created before keep their classes).

    Parameters
    ----------
    directory : str or path, optional
        A directory of ``*.py`` plugin files. None: the one MOLPREDICT_PLUGINS_DIR names now, if any.

    Returns
    -------
    Registry
        The new process-wide registry (its ``failures`` list the plugins that were skipped).

    Raises
    ------
    PluginError
        ``directory`` is not a directory (a mistyped path is not a plugin to skip).
    """
    if directory is not None and not Path(directory).is_dir():
        what = "is a file, not a plugins directory" if Path(directory).exists() else "no such plugins directory"
        raise PluginError(f"{directory}: {what}")
    registry = Registry(plugins_dir=directory)
    reset_registry(registry)
    return registry


def load_hint(registry: Registry | None = None) -> str:
    """How to load the plugin of a component that is not registered, for an error's one line: its plugin file's
    directory given to :func:`load_plugins` in Python or ``--plugins-dir`` on the command line (the directory
    MOLPREDICT_PLUGINS_DIR names when it was set after ``registry`` was built, else a placeholder).

    Parameters
    ----------
    registry : Registry, optional
        The registry that lacks the component.
    """
    stale = registry.stale_plugins_dir() if registry is not None else None
    argument = repr(stale) if stale else "DIRECTORY"
    return (f"load its plugin file with molpredict.load_plugins({argument}) in Python or --plugins-dir "
            f"{stale or 'DIRECTORY'} on the command line")


def create(kind: str, spec: "str | ComponentSpec", **overrides: Any) -> Any:
    """Shorthand for ``get_registry().create(kind, spec, **overrides)``."""
    return get_registry().create(kind, spec, **overrides)

