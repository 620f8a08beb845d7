"""Model bundles: a directory holding one fitted model per ion mode, as safetensors tensors plus JSON metadata.

Layout
------
::

    BUNDLE/
      bundle.json                 format name and version, molpredict version, ion modes, created time
      positive/metadata.json      everything inference needs except the tensors (see below)
      positive/tensors.safetensors
      negative/...                (when trained)
      text/...                    (instead, for a text -> molecule model; ``input_type`` "text")

``metadata.json`` of a sub-model holds: the format version, the molpredict version, the model's registry name
and parameters (component spec strings, grids as given), the list of components it needs (kind, registry
name, and the plugin that provided it with its version), the cleaning pipeline (``CleaningPipeline.to_dict()``), the ion mode and default adducts, the model's
own state metadata (``Model.get_state()``), the SHA-256 and size of the tensors file, the training-set hash and
filters, licence counts of the training records, the grid selection and validation metrics, and the created
time.

Loading never unpickles and never imports code named in a file: the model and its components are looked up by
registry name (a name that is not registered is a :class:`~molpredict.errors.PluginError` asking for the
plugin that provides it, or for its plugin file loaded by ``molpredict.load_plugins`` or ``--plugins-dir``; a name
now registered by another plugin than the one the model was saved with is a PluginError too, and another version of
the same plugin a one-line warning). A missing, truncated or corrupted
bundle is a :class:`~molpredict.errors.ModelFileError`. The metadata is strict JSON: a non-finite float is
written as null (files written before, with bare ``NaN``, still load).

The default bundle lives at ``$MOLPREDICT_HOME/models/default`` (``MOLPREDICT_HOME`` defaults to
``platformdirs.user_cache_dir("molpredict")``).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from molpredict import __version__
from molpredict.atomic import creation_mode, replace_atomically
from molpredict.cache import file_sha256, home_dir, known_file_sha256  # noqa: F401  (re-exported: home and hashes)
from molpredict.errors import ModelFileError, PluginError, SpecError
from molpredict.registry import load_hint
from molpredict.specs import ComponentSpec, Grid, is_no_sketch, parse_spec
from molpredict.spectra.record import ION_MODES  # the bundle is keyed by ion mode (re-exported)

__all__ = [
    "check_bundle_output",
    "check_output_folder",
    "check_writable_folder",
    "save_tensors",
    "commit_folder",
    "folder_written",
    "remove_stale_temporaries",
    "write_error",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "ION_MODES",
    "MODES",
    "TEXT_MODE",
    "SubModel",
    "ModelBundle",
    "home_dir",
    "default_bundle_path",
    "model_components",
    "bundle_components",
    "model_input_type",
    "json_ready",
    "file_sha256",
]

FORMAT_NAME = "molpredict-model-bundle"
#: 2: a bundle may hold a "text" sub-model (version-1 readers would reject its ion_modes with a confusing
#: message; with the bump they say "upgrade molpredict"). Version-1 bundles load unchanged.
FORMAT_VERSION = 2
#: the sub-model key of a text -> molecule model (inputs are descriptions, not spectra)
TEXT_MODE = "text"
#: every sub-model key a bundle may hold, in the order they are listed
MODES = ION_MODES + (TEXT_MODE,)
BUNDLE_FILE = "bundle.json"
METADATA_FILE = "metadata.json"
TENSORS_FILE = "tensors.safetensors"
PRIOR_DIR = "prior"
#: where a sub-model's learnt fragmentation model is saved (npz + JSON, :mod:`molpredict.chem.fragment_model`)
FRAGMENT_MODEL_DIR = "fragment_model"

#: the provider name of built-in components (their version is molpredict's: not compared at load)
BUILTIN = "molpredict"
#: model parameter name -> registry kind, for the parameters that name components by spec
_COMPONENT_PARAMS = {
    "input_kernel": "input_kernel",
    "output_kernel": "output_kernel",
    "input_sketch": "sketch",
    "output_sketch": "sketch",
    "sketch": "sketch",
    "encoder": "encoder",
}


def default_bundle_path() -> Path:
    """Where ``molpredict identify`` looks for a model when ``--model`` is not given."""
    return home_dir() / "models" / "default"


def json_ready(value: Any) -> Any:
    """A JSON-serialisable copy of ``value`` (numpy scalars/arrays, specs, grids and paths converted)."""
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, (ComponentSpec, Grid, Path)):
        return str(value)
    if isinstance(value, np.ndarray):
        return json_ready(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def check_output_folder(path: str | os.PathLike, is_model: Callable[[Path], bool], what: str) -> None:
    """Raise ModelFileError unless a model may be written at ``path``: it does not exist, is an empty folder, or
    ``is_model(path)`` (a model of the same kind, which saving replaces). Anything else, a file or a folder of
    other files, is never deleted to make room. Callers check before training, so the hours are not spent on an
    output that will be refused."""
    path = Path(path)
    if path.exists() and not (path.is_dir() and (not any(path.iterdir()) or is_model(path))):
        raise ModelFileError(f"{path}: exists and is not {what}; choose another output path")
    check_writable_folder(path)


def check_writable_folder(path: str | os.PathLike) -> None:
    """Raise ModelFileError unless a folder can be created at ``path``: its nearest existing ancestor (saving
    creates the missing ones) is a folder where a file can be created and removed. Trying is the only reliable
    test: ``os.access`` ignores read-only mounts on some systems, ACLs and quotas."""
    path = Path(os.path.abspath(path))
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ModelFileError(f"{path}: {folder} is not a folder; choose another output path")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot write in {folder} ({exc.strerror or exc}); choose another output "
                             f"path") from None


def write_error(exc: BaseException) -> str:
    """What went wrong writing a model, on one line: an OSError's text, or the OS message inside a
    ``SafetensorError`` (which wraps it as ``IoError(Os { ..., message: "No space left on device" })``)."""
    if isinstance(exc, OSError):
        return " ".join(str(exc).split())
    found = re.search(r'message: "([^"]*)"', str(exc))
    return found.group(1) if found else " ".join(str(exc).split())


def save_tensors(tensors: dict[str, np.ndarray], path: str | os.PathLike) -> None:
    """Write a safetensors file with the permissions ``open`` gives a new file under the umask (safetensors
    writes through a 0600 temporary file: a model shared with a group could not be loaded by it)."""
    from safetensors.numpy import save_file

    save_file(tensors, str(path))
    os.chmod(path, creation_mode())


def _process_gone(pid: int) -> bool:
    """Whether no process ``pid`` runs on this machine (one of another user counts as running)."""
    import psutil

    return not psutil.pid_exists(pid)


def remove_stale_temporaries(path: str | os.PathLike) -> None:
    """Clear what runs killed while saving a model at ``path`` left beside it: ``.NAME.tmp-PID`` folders (a
    partial model) are removed, an ``.NAME.old-PID`` folder (the previous model, set aside between the two
    renames of :func:`commit_folder`) is removed when a model is at ``path`` and put back otherwise. Only those
    of processes that are gone: another process may be saving there now. (A process on another machine sharing
    the folder cannot be told apart: two machines saving one model at once race anyway.)"""
    path = Path(path)
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.(tmp|old)-(\d+)$")
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return
    for entry in entries:
        found = pattern.match(entry.name)
        if not found or int(found.group(2)) == os.getpid() or not _process_gone(int(found.group(2))):
            continue
        if found.group(1) == "old" and not path.exists():
            with contextlib.suppress(OSError):
                os.replace(entry, path)
            continue
        shutil.rmtree(entry, ignore_errors=True)


def commit_folder(tmp: Path, path: Path) -> None:
    """Rename the complete folder ``tmp`` to ``path``: a model already there is moved aside first, put back if
    the second rename fails, and removed once the new one is in place (never deleted before)."""
    old = None
    if path.exists():
        old = path.parent / f".{path.name}.old-{os.getpid()}"
        if old.exists():
            shutil.rmtree(old)
        os.replace(path, old)
    try:
        replace_atomically(tmp, path)
    except OSError:
        if old is not None:
            os.replace(old, path)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def folder_written(path: Path, what: str) -> Iterator[Path]:
    """The save protocol of a model folder: yields an empty temporary folder beside ``path`` to write into, and
    when the block ends :func:`commit_folder` puts it in place of ``path``. Stale temporaries of killed saves are
    cleared first (:func:`remove_stale_temporaries`); on any failure or interrupt the temporary folder is removed,
    so no partial model is left.

    Raises
    ------
    ModelFileError
        Writing failed (an OSError, or a full disk as the ``SafetensorError`` of the tensors' writer), in one line:
        ``"<path>: could not write the <what>: <reason>"``.
    """
    from safetensors import SafetensorError

    def failed(exc: BaseException) -> ModelFileError:
        return ModelFileError(f"{path}: could not write the {what}: {write_error(exc)}")

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise failed(exc) from None
    remove_stale_temporaries(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir()
        yield tmp
        commit_folder(tmp, path)  # the old model is set aside, not deleted, until the new one is in place
    except (OSError, SafetensorError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise failed(exc) from None
    except BaseException:  # a state that cannot be saved, an interrupt
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_bundle_output(path: str | os.PathLike) -> None:
    """:func:`check_output_folder` for a model bundle (a folder with :data:`BUNDLE_FILE`)."""
    check_output_folder(path, lambda folder: (folder / BUNDLE_FILE).is_file(), "a model bundle")


def model_components(model: Any, registry: Any = None) -> list[dict[str, str]]:
    """The registry components a model names in its parameters: ``[{"kind", "name", "spec"}, ...]``; with a
    ``registry``, each registered one also gets the ``provider`` (plugin name) and ``version`` that registered it,
    which loading checks (:func:`_check_providers`)."""
    components = [{"kind": "model", "name": getattr(model, "registry_name", None) or type(model).__name__,
                   "spec": ""}]
    params = model.get_params() if hasattr(model, "get_params") else {}
    for param, kind in _COMPONENT_PARAMS.items():
        value = params.get(param)
        if value is None or not isinstance(value, (str, ComponentSpec)):
            continue
        text = str(value)
        if kind == "sketch" and is_no_sketch(text):
            continue  # no sketch (make_sketch's identity): nothing to look up in the registry
        try:
            name = parse_spec(text).name
        except SpecError:
            continue
        # A grid over component names (``ppk|cosine``) needs every alternative registered.
        for alternative in name.split("|"):
            components.append({"kind": kind, "name": alternative.strip(), "spec": text, "param": param})
    if registry is not None:
        for comp in components:
            comp.update(_provider_of(registry, comp["kind"], comp["name"]))
    return components


def _provider_of(registry: Any, kind: str, name: str) -> dict[str, str]:
    """``{"provider", "version"}`` of the entry registered as ``name`` (empty when none is)."""
    try:
        entry = registry.entry(kind, name)
    except (SpecError, ValueError):
        return {}
    return {"provider": entry.provider, "version": entry.version}


def _check_providers(where: str, mode: str, components: list[dict], registry: Any,
                     version_changes: set[str]) -> None:
    """Refuse a component registered now by another plugin than the one the model was saved with; add a line to
    ``version_changes`` for one now at another version of the same plugin. A component saved without a
    provider (a bundle saved before they were recorded) is checked by name only, as before.

    Raises
    ------
    PluginError
        A component is not registered, or is registered by another plugin than the recorded one.
    """
    for comp in components:
        kind, name, saved = comp.get("kind"), comp.get("name"), comp.get("provider")
        if kind not in ("model", "input_kernel", "output_kernel", "sketch", "encoder"):
            continue
        what = f"{kind.replace('_', ' ')} {name!r}"
        if name not in registry.names(kind):
            version = f" {comp['version']}" if comp.get("version") else ""
            needed = f"the plugin {saved!r}{version} that provides it" if saved else "the plugin that provides it"
            raise PluginError(f"{where}: the {mode} model needs the {what}, which is not registered; install "
                              f"{needed} (see `molpredict plugins list`) or {load_hint(registry)}")
        if not saved:
            continue
        entry = registry.entry(kind, name)
        if entry.provider != saved:
            raise PluginError(f"{where}: the {mode} model's {what} was saved with plugin {saved!r} but is now "
                              f"provided by {entry.provider!r}; load {saved!r} instead (MOLPREDICT_LOAD_PLUGINS / "
                              f"MOLPREDICT_BLOCK_PLUGINS) or retrain")
        if entry.provider != BUILTIN and comp.get("version") and entry.version != comp["version"]:
            version_changes.add(f"{what} (plugin {saved!r} {comp['version']} -> {entry.version})")


def model_input_type(model: Any) -> str:
    """What a fitted model takes: ``"text"`` or ``"spectrum"`` (its :attr:`~molpredict.models.base.Model.input_type`;
    ``spectrum`` for an object that does not say)."""
    value = getattr(model, "input_type", "spectrum")
    return value if isinstance(value, str) else "spectrum"


@dataclass
class SubModel:
    """One fitted model of a bundle, with what inference needs around it.

    Attributes
    ----------
    model : Model
        The fitted model.
    ion_mode : {"positive", "negative", "text"}
        The sub-model key (``text`` for a text -> molecule model).
    cleaning : dict or None
        ``CleaningPipeline.to_dict()`` applied to training spectra (apply the same to queries).
    adducts : list of str
        Default adducts to try for a query without a usable adduct.
    info : dict
        Training record: hashes, counts, licences, selection, validation metrics, timings.
    metadata : dict
        The full ``metadata.json`` as loaded (empty before saving).
    prior : Model or None
        The structure prior (a fitted ``prior`` model: similarity to a reference set of structures), saved in
        the sub-model's ``prior/`` directory in the same format.
    scoring : dict or None
        How the terms are fused and the confidence calibrated, per variant (``with_prior``, ``without_prior``):
        ``{variant: {"fusion": ScoreFusion.to_dict(), "calibration": Calibrator.to_dict()}}``
        (read and checked by :mod:`molpredict.identification.evidence`). None: the model's own score, no
        probability.
    fragments : dict or None
        Parameters of the candidate fragmentation scorer when the fusion uses one.
    fragment_model : FragmentModel or None
        The learnt fragmentation model (:mod:`molpredict.chem.fragment_model`) when the fusion uses it, saved in
        the sub-model's ``fragment_model/`` directory.
    source : str or None
        The ``metadata.json`` it was loaded from (named in errors about its settings).
    """

    model: Any
    ion_mode: str
    cleaning: dict | None = None
    adducts: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    prior: Any = None
    scoring: dict[str, Any] | None = None
    fragments: dict[str, Any] | None = None
    fragment_model: Any = None
    source: str | None = None

    def cleaning_pipeline(self):
        """The :class:`~molpredict.spectra.cleaning.CleaningPipeline` to apply to queries (None: no cleaning)."""
        if not self.cleaning:
            return None
        from molpredict.spectra.cleaning import CleaningPipeline
        return CleaningPipeline.from_dict(self.cleaning)


class ModelBundle:
    """A set of fitted models, one per ion mode (or one ``text`` model), saved as a directory.

    Parameters
    ----------
    models : dict
        Ion mode (``positive``, ``negative``) or ``text`` -> :class:`SubModel`.
    path : Path, optional
        Where the bundle was loaded from.
    """

    def __init__(self, models: dict[str, SubModel] | None = None, path: Path | None = None) -> None:
        self.models: dict[str, SubModel] = dict(models or {})
        self.path = path

    @property
    def ion_modes(self) -> list[str]:
        """The sub-model keys present, in :data:`MODES` order (``["text"]`` for a text model)."""
        return [mode for mode in MODES if mode in self.models]

    @property
    def input_type(self) -> str:
        """``"text"`` when the bundle holds a text model, else ``"spectrum"``."""
        return "text" if TEXT_MODE in self.models else "spectrum"

    def for_mode(self, ion_mode: str | None) -> SubModel | None:
        """The sub-model for ``ion_mode`` (None when the bundle has none for it)."""
        return self.models.get(ion_mode) if ion_mode else None

    # -- saving ----------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, registry: Any = None) -> Path:
        """Write the bundle to ``path`` (a directory), replacing an existing bundle there atomically.

        ``registry`` (default: the process-wide one) names the plugin and version of each component, recorded
        so that loading can tell a component of the same name from another plugin.

        Raises
        ------
        ModelFileError
            ``path`` exists and is not a model bundle (it is never overwritten), or writing failed.
        """
        path = Path(path)
        if not self.models:
            raise ModelFileError(f"{path}: nothing to save (the bundle has no models)")
        check_bundle_output(path)
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if registry is None:
            from molpredict.registry import get_registry
            registry = get_registry()
        with folder_written(path, "model bundle") as tmp:
            for mode, sub in self.models.items():
                self._save_submodel(sub, tmp / mode, created, registry)
            _write_json(tmp / BUNDLE_FILE, {"format": FORMAT_NAME, "format_version": FORMAT_VERSION,
                                            "molpredict_version": __version__, "created": created,
                                            "ion_modes": [m for m in MODES if m in self.models]})
        self.path = path
        return path

    @staticmethod
    def _save_submodel(sub: SubModel, directory: Path, created: str, registry: Any = None) -> None:
        directory.mkdir(parents=True)
        arrays, state = sub.model.get_state()
        tensors = {}
        for name, array in arrays.items():
            array = np.asarray(array)
            if array.dtype == object:
                raise ModelFileError(f"model state array {name!r} has dtype object: cannot be saved without pickle")
            tensors[name] = np.ascontiguousarray(array)
        tensor_path = directory / TENSORS_FILE
        save_tensors(tensors, tensor_path)
        model_name = getattr(sub.model, "registry_name", None) or type(sub.model).__name__
        params = sub.model.get_params() if hasattr(sub.model, "get_params") else {}
        metadata = {
            "format_version": FORMAT_VERSION,
            "molpredict_version": __version__,
            "created": created,
            "ion_mode": sub.ion_mode,
            "default_adducts": list(sub.adducts),
            "input_type": model_input_type(sub.model),
            "model": {"name": model_name, "params": json_ready(params)},
            "components": model_components(sub.model, registry),
            "cleaning": json_ready(sub.cleaning),
            "state": json_ready(state),
            "tensors": {"file": TENSORS_FILE, "sha256": file_sha256([tensor_path]),
                        "n_bytes": tensor_path.stat().st_size, "names": sorted(tensors)},
            **json_ready(sub.info),
        }
        if sub.prior is not None:
            ModelBundle._save_submodel(SubModel(model=sub.prior, ion_mode=sub.ion_mode), directory / PRIOR_DIR,
                                       created, registry)
            metadata["prior"] = {"directory": PRIOR_DIR, "model": sub.prior.registry_name}
        if sub.fragment_model is not None:
            sub.fragment_model.save(directory / FRAGMENT_MODEL_DIR)
            metadata["fragment_model"] = {"directory": FRAGMENT_MODEL_DIR}
        for key in ("scoring", "fragments"):
            if getattr(sub, key) is not None:
                metadata[key] = json_ready(getattr(sub, key))
        _write_json(directory / METADATA_FILE, metadata)
        sub.metadata = metadata

    # -- loading ---------------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike, registry: Any = None, ion_modes: Iterable[str] | None = None
             ) -> "ModelBundle":
        """Load a bundle.

        Parameters
        ----------
        path : str or Path
            The bundle directory.
        registry : Registry, optional
            Where to look up component names (default: the process-wide registry).
        ion_modes : iterable of str, optional
            Load only these ion modes' models.

        Raises
        ------
        ModelFileError
            Missing, truncated, corrupted or too new.
        PluginError
            The bundle names a component that no installed plugin registers.
        """
        path = Path(path)
        if not path.exists():
            raise ModelFileError(f"{path}: model bundle not found (train one with `molpredict train`)")
        if not path.is_dir():
            raise ModelFileError(f"{path}: not a model bundle (expected a directory containing {BUNDLE_FILE})")
        head = _read_json(path / BUNDLE_FILE, what="model bundle")
        if head.get("format") != FORMAT_NAME:
            raise ModelFileError(f"{path / BUNDLE_FILE}: not a molpredict model bundle")
        _check_version(head.get("format_version"), path / BUNDLE_FILE)
        modes = head.get("ion_modes")
        if not isinstance(modes, list) or not modes or any(m not in MODES for m in modes):
            raise ModelFileError(f"{path / BUNDLE_FILE}: field ion_modes is missing or invalid")
        if registry is None:
            from molpredict.registry import get_registry
            registry = get_registry()
        wanted = set(ion_modes) if ion_modes is not None else set(modes)
        version_changes: set[str] = set()
        models = {mode: cls._load_submodel(path / mode, mode, registry, version_changes)
                  for mode in modes if mode in wanted}
        if version_changes:  # one line for the bundle, not one per sub-model (or per prior) using the plugin
            warnings.warn(f"{path}: saved with other plugin versions than installed: "
                          f"{', '.join(sorted(version_changes))}; check its results, or retrain", stacklevel=2)
        return cls(models, path)

    def refitted_on_load(self) -> dict[str, list[str]]:
        """Per sub-model, the parts whose kernels had to be refitted on their landmarks at load (a bundle saved
        before fitted kernels were saved: ``molpredict model upgrade`` re-saves it); empty when none."""
        out = {}
        for mode, sub in self.models.items():
            parts = [f"{side} kernel" for side in getattr(sub.model, "refitted_on_load_", None) or []]
            parts += [f"prior {side} kernel" for side in getattr(sub.prior, "refitted_on_load_", None) or []]
            if parts:
                out[mode] = parts
        return out

    def upgrade_hint(self) -> str | None:
        """One line saying how to make this bundle load in milliseconds, or None when it already does."""
        if not self.refitted_on_load():
            return None
        where = f" {self.path}" if self.path else ""
        return (f"model{where} was saved without its fitted kernels: they were recomputed at load (seconds); "
                f"`molpredict model upgrade{where}` re-saves it to load in milliseconds")

    @staticmethod
    def _load_submodel(directory: Path, mode: str, registry: Any,
                       version_changes: set[str] | None = None) -> SubModel:
        meta_path = directory / METADATA_FILE
        metadata = _read_json(meta_path, what="model metadata")
        _check_version(metadata.get("format_version"), meta_path)
        try:
            model_name = metadata["model"]["name"]
            components = metadata.get("components", [])
            tensors_info = metadata["tensors"]
            state = metadata["state"]
        except (KeyError, TypeError) as exc:
            raise ModelFileError(f"{meta_path}: field {exc} is missing") from None
        if not isinstance(components, list) or not all(isinstance(c, dict) for c in components):
            raise ModelFileError(f"{meta_path}: field components must be a list of objects")
        _check_providers(str(directory.parent), mode, [{"kind": "model", "name": model_name}] + components,
                         registry, version_changes if version_changes is not None else set())
        tensor_path = directory / tensors_info.get("file", TENSORS_FILE)
        if not tensor_path.is_file():
            raise ModelFileError(f"{tensor_path}: tensors file is missing")
        size = tensor_path.stat().st_size
        if "n_bytes" in tensors_info and size != tensors_info["n_bytes"]:
            raise ModelFileError(f"{tensor_path}: truncated or modified ({size} bytes, expected "
                                 f"{tensors_info['n_bytes']})")
        if "sha256" in tensors_info and known_file_sha256(tensor_path) != tensors_info["sha256"]:
            raise ModelFileError(f"{tensor_path}: corrupted (SHA-256 does not match metadata.json)")
        arrays = map_tensors(tensor_path)
        model_cls = registry.get("model", model_name)
        try:
            model = model_cls.from_state(arrays, state)
        except SpecError as exc:
            raise PluginError(f"{directory.parent}: the {mode} model needs a component that is not registered "
                              f"({exc}); install the plugin that provides it or {load_hint(registry)}") from None
        except (PluginError, ModelFileError):
            raise
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            raise ModelFileError(f"{directory}: model state is inconsistent ({type(exc).__name__}: "
                                 f"{' '.join(str(exc).split())})") from None
        info_keys = ("training", "validation", "selection", "timings", "summary")
        prior = None
        if metadata.get("prior") is not None:
            prior_dir = metadata["prior"].get("directory") if isinstance(metadata["prior"], dict) else None
            if prior_dir != PRIOR_DIR:
                raise ModelFileError(f"{meta_path}: field prior.directory must be {PRIOR_DIR!r}")
            prior = ModelBundle._load_submodel(directory / PRIOR_DIR, mode, registry, version_changes).model
        extras = {}
        if metadata.get("fragment_model") is not None:
            from molpredict.chem.fragment_model import FragmentModel
            extras["fragment_model"] = FragmentModel.load(directory / FRAGMENT_MODEL_DIR)
        for key in ("scoring", "fragments"):
            value = metadata.get(key)
            if value is not None and not isinstance(value, dict):
                raise ModelFileError(f"{meta_path}: field {key} must be an object")
            extras[key] = value
        return SubModel(model=model, ion_mode=metadata.get("ion_mode", mode),
                        cleaning=metadata.get("cleaning"), adducts=list(metadata.get("default_adducts") or []),
                        info={k: metadata[k] for k in info_keys if k in metadata}, metadata=metadata,
                        prior=prior, source=str(meta_path), **extras)

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary: per ion mode, the model spec, training counts and validation metrics."""
        out: dict[str, Any] = {"path": str(self.path) if self.path else None, "ion_modes": self.ion_modes}
        for mode, sub in self.models.items():
            meta = sub.metadata
            out[mode] = {"model": _model_as_selected(meta.get("model"), sub.info.get("selection")),
                         "created": meta.get("created"), "components": _component_rows(meta.get("components")),
                         **{k: v for k, v in sub.info.items()}}
            if sub.prior is not None:
                out[mode]["prior"] = {"model": sub.prior.registry_name, "params": json_ready(sub.prior.get_params())}
            if sub.scoring:
                out[mode]["scoring"] = {variant: {"weights": v["fusion"]["weights"],
                                                  "temperature": v["fusion"].get("temperature"),
                                                  "calibrated": "calibration" in v,
                                                  "learnt_ranker": "ranker" in v["fusion"],
                                                  "second_pass": _second_pass_summary(v["fusion"])}
                                        for variant, v in sub.scoring.items()}
                weights = sub.scoring.get("with_prior", {}).get("fusion", {}).get("weights", {})
                out[mode]["prior_weight"] = weights.get("prior", 0.0)
            if sub.fragment_model is not None:
                out[mode]["fragment_model"] = json_ready(sub.fragment_model.get_params())
        return out


def _model_as_selected(model: Any, selection: Any) -> Any:
    """The saved ``model`` entry (name, params), with ``params.select_by`` annotated when the grid selection used
    another metric: without validation candidate sets the model's ``mrr`` default is not what chose the grid point
    (``selection.select_by`` is ``kernel-loss``), and showing it bare read as if it were (QA). The saved file keeps
    the parameter as given."""
    if not (isinstance(model, dict) and isinstance(model.get("params"), dict) and isinstance(selection, dict)):
        return model
    given, used = model["params"].get("select_by"), selection.get("select_by")
    if given is None or used is None or given == used:
        return model
    note = f"{given} (not used: the selection used {used}" + \
        (", no validation candidate sets were given)" if used == "kernel-loss" else ")")
    return {**model, "params": {**model["params"], "select_by": note}}


def _component_rows(components: Any, registry: Any = None) -> list[dict[str, Any]]:
    """The components as recorded (kind, name, spec, provider, version); with a ``registry``, also the plugin
    that provides each name now (``present``: None when none does)."""
    rows = []
    for comp in components if isinstance(components, list) else []:
        if not isinstance(comp, dict):
            continue
        row = {k: comp.get(k) for k in ("kind", "name", "spec", "provider", "version")}
        if registry is not None:
            present = _provider_of(registry, str(comp.get("kind")), str(comp.get("name")))
            row["present"] = present.get("provider")
            row["present_version"] = present.get("version")
        rows.append(row)
    return rows


def bundle_components(path: str | os.PathLike, registry: Any = None) -> dict[str, Any]:
    """What a bundle needs, read from its JSON files only (no model is built): per sub-model its model name,
    created time and components with the provider they were saved with and the one registered now. This works
    when a plugin is missing, where :meth:`ModelBundle.load` refuses (``molpredict model info`` shows it then).

    Raises
    ------
    ModelFileError
        Not a readable bundle.
    """
    path = Path(path)
    head = _read_json(path / BUNDLE_FILE, what="model bundle")
    if head.get("format") != FORMAT_NAME:
        raise ModelFileError(f"{path / BUNDLE_FILE}: not a molpredict model bundle")
    if registry is None:
        from molpredict.registry import get_registry
        registry = get_registry()
    modes = [m for m in head.get("ion_modes") or [] if m in MODES]
    out: dict[str, Any] = {"path": str(path), "ion_modes": modes}
    for mode in modes:
        meta = _read_json(path / mode / METADATA_FILE, what="model metadata")
        out[mode] = {"model": meta.get("model"), "created": meta.get("created"),
                     "components": _component_rows(meta.get("components"), registry)}
        if (path / mode / PRIOR_DIR / METADATA_FILE).is_file():
            prior = _read_json(path / mode / PRIOR_DIR / METADATA_FILE, what="model metadata")
            out[mode]["prior"] = {"model": prior.get("model"),
                                  "components": _component_rows(prior.get("components"), registry)}
    return out


def _second_pass_summary(fusion: dict[str, Any]) -> dict[str, Any] | None:
    """What a fusion's second pass re-ranks with (``k``, its terms, its ranker's coefficients), or None."""
    rerank = fusion.get("rerank")
    if not rerank:
        return None
    ranker = rerank.get("ranker", {})
    return {"k": rerank.get("k"), "terms": ranker.get("terms"), "coef": ranker.get("coef"),
            "set_features": ranker.get("set_features")}


#: safetensors dtype names -> numpy dtypes (little-endian, as the format stores them)
_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
                       "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}


def map_tensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of a safetensors file, memory-mapped (copy on write): loading reads only its JSON header, and
    an array's pages are read when it is used (a bundle's landmark features, its weights).

    The format: an 8-byte little-endian header length, the JSON header (``{name: {"dtype", "shape",
    "data_offsets": [begin, end]}}``, offsets from the end of the header), then the data.

    Raises
    ------
    ModelFileError
        Not a safetensors file, or an entry outside the file or of a dtype numpy does not have (bf16).
    """
    import mmap
    import struct

    path = Path(path)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            n_header = struct.unpack("<Q", handle.read(8))[0] if size >= 8 else -1
            if not 0 < n_header <= size - 8:
                raise ValueError("bad header length")
            header = json.loads(handle.read(n_header))
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY) if size else None
        arrays = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
            shape = tuple(int(n) for n in info["shape"])
            begin, end = (int(v) for v in info["data_offsets"])
            count = int(np.prod(shape, dtype=np.int64))
            if end - begin != count * dtype.itemsize or begin < 0 or 8 + n_header + end > size:
                raise ValueError(f"entry {name!r} does not fit the file")
            arrays[name] = np.frombuffer(mapped, dtype=dtype, count=count, offset=8 + n_header + begin).reshape(shape)
        return arrays
    except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error) as exc:
        raise ModelFileError(f"{path}: unreadable tensors file: {' '.join(str(exc).split())}") from None


def _write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as strict JSON: a non-finite float (a validation loss that could not be computed) becomes
    null, as ``allow_nan=False`` checks; Python's bare ``NaN`` is refused by jq and JSON.parse. Readers accept both
    (bundles written before hold ``NaN``)."""
    from molpredict.io.results import json_safe

    with open(path, "w", encoding="utf-8") as handle:
        json.dump(json_safe(obj), handle, indent=2, sort_keys=False, allow_nan=False)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())


def _read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise ModelFileError(f"{path}: {what} file is missing")
    try:
        with open(path, encoding="utf-8") as handle:
            obj = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"{path}: corrupted or truncated {what} ({type(exc).__name__} at "
                             f"{getattr(exc, 'pos', '?')})") from None
    if not isinstance(obj, dict):
        raise ModelFileError(f"{path}: corrupted {what} (not a JSON object)")
    return obj


def _check_version(version: Any, path: Path) -> None:
    if not isinstance(version, int):
        raise ModelFileError(f"{path}: field format_version is missing or invalid")
    if version > FORMAT_VERSION:
        raise ModelFileError(f"{path}: format version {version} is newer than this molpredict supports "
                             f"({FORMAT_VERSION}); upgrade molpredict")
