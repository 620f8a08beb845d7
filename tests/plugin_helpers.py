"""What the tests of plugin components share: a plugins directory made the process's own, a least kernel."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from molpredict.kernels import InputKernel


class OnesKernel(InputKernel):
    """The least input kernel: every object the feature (1,), so every value 1: what a test of registration or
    provenance needs, no spectrum arithmetic."""

    def featurize(self, objects):
        return np.ones((len(objects), 1))

    def pairwise(self, fa, fb):
        return fa @ fb.T

    def self_similarity(self, f):
        return (f * f).sum(axis=1)


def use_plugins_dir(tmp_path: Path, monkeypatch, files: dict[str, str]) -> Path:
    """A plugins directory under ``tmp_path`` holding ``files`` (file name -> Python source), made this process's:
    ``MOLPREDICT_PLUGINS_DIR`` names it, ``MOLPREDICT_LOAD_PLUGINS`` is unset (every plugin loads),
    ``MOLPREDICT_HOME`` is in ``tmp_path``, and the registry is rebuilt (monkeypatch undoes the environment; the
    caller resets the registry after the test as it needs)."""
    from molpredict.registry import reset_registry

    plugins = tmp_path / "plugins"
    plugins.mkdir()
    for name, source in files.items():
        (plugins / name).write_text(source)
    monkeypatch.delenv("MOLPREDICT_LOAD_PLUGINS", raising=False)
    monkeypatch.setenv("MOLPREDICT_PLUGINS_DIR", str(plugins))
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    reset_registry()
    return plugins
