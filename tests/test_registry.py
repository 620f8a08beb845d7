"""The plugin registry: built-ins, throw-away plugins, entry points, plugin directories, failures, the CLI."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from molpredict.builtins import INPUT_KERNELS, MODELS, OUTPUT_KERNELS, SKETCHES
from molpredict.cli import cli
from molpredict.errors import PluginError, SpecError
from molpredict.hookspecs import hookimpl
from molpredict.registry import KINDS, Registry, get_registry
from molpredict.kernels import InputKernel

PLUGIN_DIR = Path(__file__).resolve().parents[1] / "plugins" / "molpredict-precursor-kernel"

ISSUE_NAMES = {
    "input_kernel": {"ppk", "ppk-losses", "cosine"},
    "output_kernel": {"tanimoto", "gaussian-tanimoto", "fingerprint-cosine"},
    "sketch": {"subsample", "gaussian", "p-sparsified-rademacher", "p-sparsified-gaussian", "accumulation",
               "adaptive"},
    "model": {"iokr", "siokr", "isokr", "sisokr"},
}


class ToyKernel(InputKernel):
    def __init__(self, scale: float = 1.0, mode: str = "a") -> None:
        self.scale = scale
        self.mode = mode

    def featurize(self, objects):
        import numpy as np
        return np.asarray(objects, dtype=float)

    def pairwise(self, fa, fb):
        return self.scale * fa[:, None] * fb[None, :]

    def self_similarity(self, f):
        return self.scale * f**2


class ToyPlugin:
    __name__ = "toy-plugin"

    @hookimpl
    def register_input_kernels(self, register):
        register("toy", ToyKernel)


def test_builtins_register_every_required_name():
    reg = Registry(load_external=False)
    for kind, names in ISSUE_NAMES.items():
        assert names <= set(reg.names(kind)), kind
    assert all(e.provider == "molpredict" for e in reg.entries())


def test_builtin_tables_match_registry():
    reg = Registry(load_external=False)
    assert set(reg.names("input_kernel")) == set(INPUT_KERNELS)
    assert set(reg.names("output_kernel")) == set(OUTPUT_KERNELS)
    assert set(reg.names("sketch")) == set(SKETCHES)
    assert set(reg.names("model")) == set(MODELS)


def test_throwaway_plugin_registers_and_creates_with_spec():
    reg = Registry(load_external=False, extra_plugins=[ToyPlugin()])
    entry = reg.entry("input_kernel", "toy")
    assert entry.provider == "toy-plugin"
    kernel = reg.create("input_kernel", "toy:scale=2.5,mode=b")
    assert isinstance(kernel, ToyKernel) and kernel.scale == 2.5 and kernel.mode == "b"
    assert type(kernel).registry_name == "toy"
    assert str(kernel.to_spec()) == "toy:scale=2.5,mode=b"
    # the throw-away plugin is gone from a fresh registry
    assert "toy" not in Registry(load_external=False).names("input_kernel")


def test_unknown_name_lists_valid_names():
    reg = Registry(load_external=False)
    with pytest.raises(SpecError) as err:
        reg.get("sketch", "subsampel")
    assert "subsample" in str(err.value) and "gaussian" in str(err.value)


def test_unknown_parameter_lists_valid_ones():
    reg = Registry(load_external=False, extra_plugins=[ToyPlugin()])
    with pytest.raises(SpecError) as err:
        reg.create("input_kernel", "toy:scael=2")
    assert "scael" in str(err.value) and "scale" in str(err.value) and "mode" in str(err.value)


def test_grid_spec_cannot_be_instantiated_directly():
    reg = Registry(load_external=False, extra_plugins=[ToyPlugin()])
    with pytest.raises(SpecError):
        reg.create("input_kernel", "toy:scale=1|2")


def test_duplicate_name_is_an_error_naming_both_providers(capsys):
    class Dup:
        __name__ = "dup-plugin"

        @hookimpl
        def register_input_kernels(self, register):
            register("ppk", ToyKernel)

    reg = Registry(load_external=False, extra_plugins=[Dup()])
    assert reg.entry("input_kernel", "ppk").provider == "molpredict"
    assert any("molpredict" in f.reason and "dup-plugin" in f.reason for f in reg.failures)
    with pytest.raises(PluginError, match="dup-plugin"):
        Registry(load_external=False, extra_plugins=[Dup()], strict=True)


def test_same_name_in_different_kinds_is_fine():
    class Other:
        __name__ = "other"

        @hookimpl
        def register_sketches(self, register):
            register("ppk", "molpredict.engine.sketches:SubsampleSketch")

    reg = Registry(load_external=False, extra_plugins=[Other()])
    assert reg.entry("sketch", "ppk").provider == "other"
    assert not reg.failures


def test_misspelled_hook_is_caught_and_plugin_skipped(capsys):
    class Typo:
        __name__ = "typo"

        @hookimpl
        def register_input_kernel(self, register):  # missing "s"
            register("typo-kernel", ToyKernel)

    reg = Registry(load_external=False, extra_plugins=[Typo()])
    assert "typo-kernel" not in reg.names("input_kernel")
    assert any("register_input_kernel" in f.reason for f in reg.failures)
    assert "typo" in capsys.readouterr().err


def test_plugins_dir_loads_files_and_isolates_broken_ones(tmp_path, monkeypatch, capsys):
    (tmp_path / "good.py").write_text(textwrap.dedent("""
        from molpredict.hookspecs import hookimpl
        __version__ = "9.9"
        @hookimpl
        def register_sketches(register):
            register("my-sketch", "molpredict.engine.sketches:SubsampleSketch")
    """))
    (tmp_path / "broken.py").write_text("import a_module_that_does_not_exist\n")
    monkeypatch.delenv("MOLPREDICT_LOAD_PLUGINS", raising=False)
    reg = Registry(plugins_dir=tmp_path)
    entry = reg.entry("sketch", "my-sketch")
    assert (entry.provider, entry.version) == ("good", "9.9")
    assert [f.plugin for f in reg.failures] == ["broken"]
    err = capsys.readouterr().err
    assert "broken" in err and "a_module_that_does_not_exist" in err and len(err.strip().splitlines()) == 1
    monkeypatch.setenv("MOLPREDICT_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match=r"^plugin 'broken' failed \(MOLPREDICT_STRICT_PLUGINS=1\): ") as failed:
        Registry(plugins_dir=tmp_path)
    assert "skipped" not in str(failed.value)  # fatal: nothing was skipped


def test_load_and_block_lists(tmp_path, monkeypatch):
    for name in ("one", "two"):
        (tmp_path / f"{name}.py").write_text(
            "from molpredict.hookspecs import hookimpl\n"
            "@hookimpl\n"
            f"def register_models(register):\n    register('{name}-model', 'molpredict.models.okr:SISOKR')\n")
    monkeypatch.setenv("MOLPREDICT_LOAD_PLUGINS", "two")
    assert {"two-model"} == set(Registry(plugins_dir=tmp_path).names("model")) - set(MODELS)
    monkeypatch.delenv("MOLPREDICT_LOAD_PLUGINS")
    monkeypatch.setenv("MOLPREDICT_BLOCK_PLUGINS", "one")
    assert {"two-model"} == set(Registry(plugins_dir=tmp_path).names("model")) - set(MODELS)
    monkeypatch.setenv("MOLPREDICT_LOAD_PLUGINS", "")
    assert set(Registry(plugins_dir=tmp_path).names("model")) == set(MODELS)


def test_broken_plugin_does_not_break_unrelated_commands(tmp_path, monkeypatch):
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.delenv("MOLPREDICT_LOAD_PLUGINS", raising=False)
    monkeypatch.setenv("MOLPREDICT_PLUGINS_DIR", str(tmp_path))
    result = CliRunner().invoke(cli, ["plugins", "list", "--json"])
    assert result.exit_code == 0, result.output
    names = {row["name"] for row in json.loads(result.stdout)}
    assert ISSUE_NAMES["model"] <= names
    assert "boom" in result.stderr


def test_plugins_list_json_has_required_fields():
    result = CliRunner().invoke(cli, ["plugins", "list", "--json"])
    assert result.exit_code == 0
    rows = json.loads(result.stdout)
    for row in rows:
        assert {"name", "kind", "provider", "version"} <= set(row)
        assert row["kind"] in KINDS
    listed = {(r["kind"], r["name"]) for r in rows}
    for kind, names in ISSUE_NAMES.items():
        assert {(kind, n) for n in names} <= listed


def test_plugins_list_table():
    result = CliRunner().invoke(cli, ["plugins", "list", "--kind", "sketch"])
    assert result.exit_code == 0
    lines = result.stdout.strip().splitlines()
    assert lines[0].split() == ["kind", "name", "provider", "version"]
    assert len(lines) == 1 + len(SKETCHES)


def test_help_documents_every_command():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name, command in cli.commands.items():
        assert name in result.stdout
        assert command.help or command.short_help, f"command {name} has no help"


def _installed_plugin_env(tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(PLUGIN_DIR)], check=True, capture_output=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(target), env.get("PYTHONPATH", "")])
    return env


def test_example_plugin_installs_and_is_listed(tmp_path):
    env = _installed_plugin_env(tmp_path)
    env.pop("MOLPREDICT_LOAD_PLUGINS", None)
    out = subprocess.run([sys.executable, "-m", "molpredict", "plugins", "list", "--json"],
                         env=env, capture_output=True, text=True, check=True).stdout
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["precursor-gaussian"]["provider"] == "precursor-kernel"
    assert rows["precursor-gaussian"]["version"] == "0.1.0"
    assert rows["precursor-gaussian"]["kind"] == "input_kernel"

    # ... and the suite's setting (MOLPREDICT_LOAD_PLUGINS="") keeps it out: no accidental leaks into tests.
    env["MOLPREDICT_LOAD_PLUGINS"] = ""
    out = subprocess.run([sys.executable, "-m", "molpredict", "plugins", "list", "--json"],
                         env=env, capture_output=True, text=True, check=True).stdout
    assert "precursor-gaussian" not in {r["name"] for r in json.loads(out)}


def test_suite_registry_has_only_builtins():
    assert os.environ.get("MOLPREDICT_LOAD_PLUGINS") == ""
    assert {e.provider for e in get_registry().entries()} == {"molpredict"}


def test_example_plugin_kernel_values(tmp_path):
    sys.path.insert(0, str(PLUGIN_DIR))
    try:
        from molpredict_precursor_kernel import PrecursorGaussianKernel
    finally:
        sys.path.remove(str(PLUGIN_DIR))
    from molpredict.spectra.record import Spectrum
    spectra = [Spectrum(id=str(i), mz=[100.0], intensities=[1.0], precursor_mz=p)
               for i, p in enumerate([100.0, 101.0, None])]
    k = PrecursorGaussianKernel(width=1.0).fit(spectra).gram()
    import numpy as np
    expected = np.array([[1, np.exp(-0.5), 0], [np.exp(-0.5), 1, 0], [0, 0, 1]])
    np.testing.assert_allclose(k, expected, atol=1e-12)


def test_a_plugin_that_registers_badly_is_skipped_whole(tmp_path, monkeypatch, capsys):
    """A third-party registration error (not a class) skips that plugin, the components it had registered
    included, with one warning: the other commands keep working. Strict mode makes it fatal."""
    (tmp_path / "bad.py").write_text(textwrap.dedent("""
        from molpredict.hookspecs import hookimpl
        @hookimpl
        def register_input_kernels(register):
            register("fine-kernel", "molpredict.kernels.spectra:CosineKernel")
            register("not-a-class", 42)
    """))
    monkeypatch.delenv("MOLPREDICT_LOAD_PLUGINS", raising=False)
    reg = Registry(plugins_dir=tmp_path)
    assert [f.plugin for f in reg.failures] == ["bad"] and "must be a class" in reg.failures[0].reason
    assert "fine-kernel" not in reg.names("input_kernel") and "ppk" in reg.names("input_kernel")
    assert "plugin 'bad' skipped" in capsys.readouterr().err
    monkeypatch.setenv("MOLPREDICT_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match="'bad' failed .*must be a class"):
        Registry(plugins_dir=tmp_path)


_FAILING_KERNELS = '''
import numpy as np
from molpredict.hookspecs import hookimpl
from molpredict.kernels import InputKernel

class FailingKernel(InputKernel):
    def __init__(self, fail: str = "raise") -> None:
        self.fail = fail

    def featurize(self, spectra):
        return np.array([[float(s.n_peaks), float(s.precursor_mz or 0.0)] for s in spectra])

    def pairwise(self, fa, fb):
        if self.fail == "raise":
            raise ValueError("boom in pairwise")
        k = fa @ fb.T
        if self.fail == "row-nan":
            k[0, :] = np.nan
        return k

    def self_similarity(self, f):
        if self.fail == "self-nan":
            return np.full(len(f), np.nan)
        return (f * f).sum(axis=1)

@hookimpl
def register_input_kernels(register):
    register("failing", FailingKernel)
'''


@pytest.mark.parametrize("fail, message", [
    ("raise", "plugin 'failing' failed: ValueError: boom in pairwise (at "),
    ("row-nan", "input kernel 'failing' from plugin 'failing' (FailingKernel): pairwise returned NaN or infinite "
                "values"),
    ("self-nan", "input kernel 'failing' from plugin 'failing' (FailingKernel): self_similarity returned NaN or "
                 "infinite values")])
def test_a_plugin_kernel_that_fails_is_a_plugin_error_naming_it(tmp_path, monkeypatch, fail, message):
    """A plugin's kernel that raises, or returns NaN (a NaN self-similarity zeroed every score silently), stops
    training with one line naming the plugin or kernel and exit 3, never an internal error."""
    from identification_helpers import synthetic_spectra
    from molpredict.io import write_mgf
    from plugin_helpers import use_plugins_dir

    use_plugins_dir(tmp_path, monkeypatch, {"failing.py": _FAILING_KERNELS})
    spectra, _ = synthetic_spectra(n_per=2, seed=0)
    write_mgf(spectra, tmp_path / "train.mgf")
    result = CliRunner().invoke(cli, ["train", str(tmp_path / "train.mgf"), "-o", str(tmp_path / "m"),
                                      "--input-kernel", f"failing:fail={fail}", "--lam", "0.1", "--device", "cpu",
                                      "--no-fragments", "--prior", "none", "--input-sketch", "subsample:m=8",
                                      "--output-sketch", "subsample:m=8"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 3 and "Traceback" not in result.output, result.output
    assert message in lines[-1] and "internal error" not in result.output
