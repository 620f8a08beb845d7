"""A bundle records the plugin (and version) of each component: loading with another plugin's component of the
same name is refused, another version warns once, a missing plugin is named; `model info` shows the components
when a plugin is missing; the metadata is strict JSON (no bare NaN) and old files with NaN still load."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from click.testing import CliRunner

from identification_helpers import FAKE_MODEL, FingerprintRidge, synthetic_spectra
from molpredict.cli import cli
from molpredict.errors import PluginError
from molpredict.hookspecs import hookimpl
from molpredict.modelfile import ModelBundle, SubModel
from molpredict.registry import Registry, reset_registry
from plugin_helpers import OnesKernel


class Alpha(OnesKernel):
    pass


class Beta(Alpha):
    def pairwise(self, fa, fb):
        return (fa @ fb.T) ** 2


class FakeModels:
    """The test model's plugin (another than the kernel's)."""
    __name__ = "fake-models"

    @hookimpl
    def register_models(self, register):
        register(FAKE_MODEL, FingerprintRidge)


def _registry(provider: str | None, cls: type = Alpha, version: str = "1.0") -> Registry:
    """Built-ins, the test model, and plugin ``provider`` (at ``version``) registering ``shared-name``."""
    class Plugin:
        __name__ = provider
        __version__ = version

        @hookimpl
        def register_input_kernels(self, register):
            register("shared-name", cls)

    registry = Registry(load_external=False, extra_plugins=[FakeModels()] + ([Plugin()] if provider else []))
    reset_registry(registry)
    return registry


def _save(tmp_path, registry, modes=("positive",), info=None) -> "Path":
    spectra, molecules = synthetic_spectra(n_per=2)
    model = registry.create("model", f"{FAKE_MODEL}:dim=32", lam="0.1", input_kernel="shared-name")
    model.fit(spectra, molecules)
    subs = {mode: SubModel(model=model, ion_mode=mode, info=info or {}) for mode in modes}
    return ModelBundle(subs).save(tmp_path / "bundle", registry=registry)


def _components(path, mode="positive"):
    return json.loads((path / mode / "metadata.json").read_text())["components"]


def test_components_record_their_provider_and_version(tmp_path):
    path = _save(tmp_path, _registry("alpha", Alpha, "1.0"))
    found = {(c["kind"], c["name"]): (c.get("provider"), c.get("version")) for c in _components(path)}
    assert found[("input_kernel", "shared-name")] == ("alpha", "1.0")
    assert found[("model", FAKE_MODEL)] == ("fake-models", "local")


def test_a_component_of_the_same_name_from_another_plugin_is_refused(tmp_path):
    path = _save(tmp_path, _registry("alpha", Alpha))
    registry = _registry("beta", Beta)
    with pytest.raises(PluginError) as refused:
        ModelBundle.load(path, registry=registry)
    text = str(refused.value)
    assert "\n" not in text and "'shared-name'" in text and "saved with plugin 'alpha'" in text
    assert "provided by 'beta'" in text


def test_another_version_of_the_same_plugin_warns_once(tmp_path):
    path = _save(tmp_path, _registry("alpha", Alpha, "1.0"), modes=("positive", "negative"))
    registry = _registry("alpha", Alpha, "2.0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bundle = ModelBundle.load(path, registry=registry)
    assert bundle.ion_modes == ["positive", "negative"]
    lines = [str(w.message) for w in caught]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "input kernel 'shared-name' (plugin 'alpha' 1.0 -> 2.0)" in lines[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same version: silent
        ModelBundle.load(path, registry=_registry("alpha", Alpha, "1.0"))


def test_a_bundle_saved_without_providers_loads_as_before(tmp_path):
    path = _save(tmp_path, _registry("alpha", Alpha))
    meta_path = path / "positive" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    for comp in meta["components"]:
        comp.pop("provider"), comp.pop("version")
    meta_path.write_text(json.dumps(meta))
    assert ModelBundle.load(path, registry=_registry("beta", Beta)).ion_modes == ["positive"]


def test_a_missing_plugin_is_named_by_the_provider_recorded(tmp_path):
    path = _save(tmp_path, _registry("alpha", Alpha, "1.5"))
    with pytest.raises(PluginError) as missing:
        ModelBundle.load(path, registry=_registry(None))
    assert "input kernel 'shared-name'" in str(missing.value)
    assert "install the plugin 'alpha' 1.5 that provides it" in str(missing.value)


def test_model_info_shows_components_and_providers_when_a_plugin_is_missing(tmp_path):
    path = _save(tmp_path, _registry("alpha", Alpha))
    _registry(None)  # the model's plugin, not alpha
    result = CliRunner().invoke(cli, ["model", "info", str(path)])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    rows = {c["name"]: c for c in info["positive"]["components"]}
    assert rows["shared-name"]["provider"] == "alpha" and rows["shared-name"]["present"] is None
    assert rows[FAKE_MODEL]["present"] == rows[FAKE_MODEL]["provider"] == "fake-models"
    assert "not registered" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    # loaded normally, the description has the components too
    _registry("alpha", Alpha)
    described = json.loads(CliRunner().invoke(cli, ["model", "info", str(path)]).stdout)
    assert {c["name"]: c["provider"] for c in described["positive"]["components"]}["shared-name"] == "alpha"
    from molpredict.modelfile import bundle_components
    assert bundle_components(path)["positive"]["model"]["name"] == FAKE_MODEL


def _strict(text: str):
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_metadata_is_strict_json_and_old_files_with_nan_still_load(tmp_path):
    registry = _registry("alpha", Alpha)
    path = _save(tmp_path, registry, info={"validation": {"loss": float("nan"), "top1": np.float64(np.inf)},
                                           "selection": {"points": [{"val_loss": float("nan")}]}})
    meta_path = path / "positive" / "metadata.json"
    meta = _strict(meta_path.read_text())
    assert meta["validation"] == {"loss": None, "top1": None}
    assert meta["selection"]["points"][0]["val_loss"] is None
    _strict((path / "bundle.json").read_text())
    assert ModelBundle.load(path, registry=registry).for_mode("positive").info["validation"]["loss"] is None
    # a bundle written before: bare NaN in its metadata
    meta_path.write_text(meta_path.read_text().replace('"loss": null', '"loss": NaN'))
    loaded = ModelBundle.load(path, registry=registry).for_mode("positive")
    assert np.isnan(loaded.info["validation"]["loss"])
