"""Loading plugins: a plugins directory from Python after the registry was built (load_plugins), a mistyped
--plugins-dir, the kinds `plugins --help` names, and spec values that reach a text parameter as text."""
from __future__ import annotations

import textwrap
from typing import Optional

import pytest
from click.testing import CliRunner

import molpredict
from molpredict.cli import cli, main
from molpredict.errors import PluginError, SpecError
from molpredict.hookspecs import hookimpl
from molpredict.registry import KINDS, Registry, get_registry, load_plugins, reset_registry
from molpredict.specs import ComponentSpec, parse_spec
from plugin_helpers import OnesKernel

_DIR_KERNEL = """
from molpredict.hookspecs import hookimpl
from molpredict.kernels.spectra import PPKernel


class LaterPPK(PPKernel):
    pass


@hookimpl
def register_input_kernels(register):
    register("later-ppk", LaterPPK)
"""


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    directory = tmp_path / "plugins"
    directory.mkdir()
    (directory / "later.py").write_text(_DIR_KERNEL)
    monkeypatch.delenv("MOLPREDICT_LOAD_PLUGINS", raising=False)
    return directory


def test_load_plugins_loads_a_directory_after_the_registry_was_built(plugins, monkeypatch):
    assert molpredict.load_plugins is load_plugins and "load_plugins" in molpredict.__all__
    get_registry()  # a first call built the registry: setting the variable now is not read again ...
    monkeypatch.setenv("MOLPREDICT_PLUGINS_DIR", str(plugins))
    with pytest.warns(UserWarning, match=r"set after the plugin registry was built .* molpredict\.load_plugins"):
        registry = get_registry()
    with pytest.raises(SpecError, match=r"unknown input kernel 'later-ppk'.*call molpredict\.load_plugins\("):
        registry.create("input_kernel", "later-ppk")
    assert load_plugins(plugins) is get_registry()  # ... this loads it
    assert get_registry().entry("input_kernel", "later-ppk").provider == "later"
    assert "load_plugins" not in str(get_registry().stale_plugins_dir() or "")
    monkeypatch.delenv("MOLPREDICT_PLUGINS_DIR")
    reset_registry()
    assert "later-ppk" not in get_registry().names("input_kernel")
    monkeypatch.setenv("MOLPREDICT_PLUGINS_DIR", str(plugins))
    assert "later-ppk" in load_plugins().names("input_kernel")  # None: the directory the variable names now
    with pytest.raises(PluginError, match="no such plugins directory$"):
        load_plugins(plugins / "typo")
    with pytest.raises(PluginError, match="is a file, not a plugins directory$"):
        load_plugins(plugins / "later.py")


def test_a_mistyped_plugins_dir_option_is_a_usage_error(plugins, tmp_path, capsys, monkeypatch):
    missing = tmp_path / "plugnis"
    monkeypatch.setenv("MOLPREDICT_PLUGINS_DIR", "")  # main() sets it from the option: undone after the test
    with pytest.raises(SystemExit) as done:
        main(["--plugins-dir", str(missing), "plugins", "list"])
    assert done.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == [f"molpredict: error: {missing}: no such plugins directory (--plugins-dir)"]
    result = CliRunner().invoke(cli, [f"--plugins-dir={missing}", "plugins", "list"])  # `cli` called itself
    assert result.exit_code == 2 and result.stderr.strip().splitlines() == err
    # the variable may be set for every shell: a one-line warning naming it, and the command runs
    monkeypatch.setenv("MOLPREDICT_PLUGINS_DIR", str(missing))
    reset_registry()
    result = CliRunner().invoke(cli, ["plugins", "list"])
    assert result.exit_code == 0, result.output
    warned = [line for line in result.stderr.splitlines() if line.startswith("molpredict: warning")]
    assert warned == [f"molpredict: warning: plugin '{missing}' skipped: plugins directory "
                      f"(MOLPREDICT_PLUGINS_DIR) does not exist"]
    monkeypatch.setenv("MOLPREDICT_PLUGINS_DIR", "")
    result = CliRunner().invoke(cli, ["--plugins-dir", str(plugins), "plugins", "list", "--kind", "input_kernel"])
    assert result.exit_code == 0, result.output  # a directory that exists is no usage error


def test_plugins_help_names_every_kind():
    result = CliRunner().invoke(cli, ["plugins", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for kind in KINDS:
        assert kind.replace("_", " ") in text, kind
    assert "commands" in text


class _Texts(OnesKernel):
    """Parameters of every flavour: text only, text or None, number, unannotated text and number defaults."""

    def __init__(self, mode: str = "ok", label: Optional[str] = None, tag: "str | None" = None, n_bins: int = 10,
                 scale: float = 1.0, flag=False, note="x") -> None:
        self.mode, self.label, self.tag, self.n_bins = mode, label, tag, n_bins
        self.scale, self.flag, self.note = scale, flag, note


class _TextsPlugin:
    __name__ = "texts"

    @staticmethod
    @hookimpl
    def register_input_kernels(register):
        register("texts", _Texts)


@pytest.mark.parametrize("text", ["inf", "nan", "true", "Yes", "1e3", "007", "none"])
def test_a_text_parameter_gets_the_text_of_its_spec_value(text):
    registry = Registry(load_external=False, extra_plugins=[_TextsPlugin()])
    kernel = registry.create("input_kernel", f"texts:mode={text},note={text},label={text},tag={text},scale=1e3,"
                                             f"n_bins=12,flag=yes")
    assert kernel.mode == text and type(kernel.mode) is str  # annotated str: the text as written
    for optional in (kernel.label, kernel.tag, kernel.note):  # str | None, and a str default: None stays None
        assert optional is None if text == "none" else optional == text
    assert (kernel.scale, kernel.n_bins, kernel.flag) == (1000.0, 12, True)  # numbers are read as before


def test_a_grid_point_keeps_its_own_text_and_a_built_spec_its_values():
    registry = Registry(load_external=False, extra_plugins=[_TextsPlugin()])
    points = parse_spec("texts:mode=inf|col|1e3,scale=1|2").expand()
    assert [(p.params["mode"], p.params["scale"]) for p in points][:2] == [(float("inf"), 1), (float("inf"), 2)]
    assert [registry.create("input_kernel", p).mode for p in points] == ["inf", "inf", "col", "col", "1e3", "1e3"]
    assert [registry.create("input_kernel", p).scale for p in points] == [1, 2] * 3
    assert points[0] == parse_spec("texts:mode=inf,scale=1")  # the texts are not part of a spec's value
    # a spec built from values (a saved model's parameters), not parsed: the values as they are
    assert registry.create("input_kernel", ComponentSpec("texts", {"mode": 2.5})).mode == 2.5


def test_a_text_parameter_keeps_its_text_through_the_spec_string():
    """A spec is passed on as a string (a grid point to the Nystrom map, a nested spec): the text parameter got
    ``"1000.0"`` for ``mode=1e3`` there, while the number parameter is read the same either way."""
    from molpredict.specs import nested_spec

    registry = Registry(load_external=False, extra_plugins=[_TextsPlugin()])
    points = parse_spec("texts:mode=1e3|007,note=true,scale=1e3").expand()
    kernels = [registry.create("input_kernel", parse_spec(nested_spec(point))) for point in points]
    assert [(k.mode, k.note, k.scale) for k in kernels] == [("1e3", "true", 1000.0), ("007", "true", 1000.0)]


def test_a_plugins_dir_file_is_imported_under_its_module_name_from_the_row_workers(plugins, tmp_path):
    """What a row worker does before it unpickles a kernel: the plugin modules of this process, by file."""
    import pickle
    import subprocess
    import sys

    from conftest import child_pythonpath
    from molpredict.registry import plugin_files

    kernel = Registry(plugins_dir=plugins).create("input_kernel", "later-ppk")
    assert plugin_files()["molpredict_plugin_later"] == str(plugins / "later.py")
    shipped = tmp_path / "kernel.pickle"
    with open(shipped, "wb") as handle:
        pickle.dump(plugin_files(), handle)
        pickle.dump(kernel, handle)
    script = textwrap.dedent(f"""
        import pickle
        from molpredict.registry import find_plugin_files
        with open({str(shipped)!r}, "rb") as handle:
            find_plugin_files(pickle.load(handle))
            kernel = pickle.load(handle)
        print(type(kernel).__module__, type(kernel).__name__)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**__import__("os").environ, "PYTHONPATH": child_pythonpath()})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["molpredict_plugin_later", "LaterPPK"]
