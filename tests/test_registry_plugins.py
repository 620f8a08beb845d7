"""Plugin registration mistakes found by writing plugins from the docs: a skipped plugin is skipped whole, only
subclasses of a kind's base class register, an alias of a class never renames it, silent mistakes are reported,
a plugin command never replaces a built-in one, and `plugins list` says where each plugin came from."""
import copy
import importlib.metadata
import json
import pickle
import sys
import textwrap

import click
import numpy as np
import pytest
from click.testing import CliRunner

from molpredict.cli import cli
from molpredict.errors import PluginError
from molpredict.hookspecs import hookimpl
from molpredict.kernels import InputKernel
from molpredict.registry import Registry, reset_registry

KERNEL = '''
import numpy as np
from molpredict.hookspecs import hookimpl
from molpredict.kernels import InputKernel

class Binned(InputKernel):
    def __init__(self, n_bins: int = 10) -> None:
        self.n_bins = n_bins
    def featurize(self, objects):
        return np.asarray([[float(len(getattr(s, "mz", [])))] for s in objects])
    def pairwise(self, fa, fb):
        return fa @ fb.T
    def self_similarity(self, f):
        return (f * f).sum(axis=1)
'''


class Toy(InputKernel):
    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def featurize(self, objects):
        return np.asarray(objects, dtype=float)[:, None]

    def pairwise(self, fa, fb):
        return self.scale * fa @ fb.T

    def self_similarity(self, f):
        return self.scale * (f * f).sum(axis=1)


def _plugin(name, **hooks):
    """A plugin object named ``name`` whose hooks are ``hooks`` (hook name -> function of register / cli)."""
    namespace = {"__name__": name}
    for hook, function in hooks.items():
        namespace[hook] = staticmethod(hookimpl(function))
    return type(name.replace("-", "_"), (), namespace)()


def _plugins_dir(tmp_path, monkeypatch, **files):
    for name, text in files.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.delenv("MOLPREDICT_LOAD_PLUGINS", raising=False)
    return tmp_path


# -- 2. a skipped plugin is skipped whole ---------------------------------------------------------------------
def test_a_plugin_clashing_with_a_builtin_is_skipped_whole(capsys):
    def hook(register):
        register("cb-kernel", Toy)
        register("ppk", Toy)

    reg = Registry(load_external=False, extra_plugins=[_plugin("clashbuiltin", register_input_kernels=hook)])
    assert "cb-kernel" not in reg.names("input_kernel")
    assert reg.entry("input_kernel", "ppk").provider == "molpredict"
    assert [f.plugin for f in reg.failures] == ["clashbuiltin"] and "clashbuiltin" not in reg.providers()
    assert capsys.readouterr().err.count("skipped") == 1


def test_a_hook_that_registers_then_raises_skips_the_plugin_whole():
    def kernels(register):
        register("hr-kernel", Toy)

    def sketches(register):
        raise KeyError("late failure")

    reg = Registry(load_external=False,
                   extra_plugins=[_plugin("hookraises", register_input_kernels=kernels, register_sketches=sketches)])
    assert "hr-kernel" not in reg.names("input_kernel")
    assert "KeyError" in reg.failures[0].reason and "late failure" in reg.failures[0].reason
    assert not reg.pm.has_plugin("hookraises")


def test_a_plugins_dir_file_clashing_with_an_entry_point_is_skipped_whole(tmp_path, monkeypatch):
    """The entry point (loaded first) keeps its names; the file that registers one of them is skipped whole; a
    file with the entry point's name is reported, not silently ignored."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "qa_ep_mod.py").write_text(KERNEL + "\n@hookimpl\ndef register_input_kernels(register):\n"
                                                "    register('ep-binned', Binned)\n")
    monkeypatch.syspath_prepend(str(site))
    ep = importlib.metadata.EntryPoint(name="qa-ep", value="qa_ep_mod", group="molpredict")
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [ep] if group == "molpredict" else [])
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    _plugins_dir(plugins, monkeypatch, dirclash=KERNEL + """
@hookimpl
def register_input_kernels(register):
    register("dir-only", Binned)
    register("ep-binned", Binned)
""", **{"qa-ep": KERNEL + "\n@hookimpl\ndef register_input_kernels(register):\n    register('file-ep', Binned)\n"})
    reg = Registry(plugins_dir=plugins)
    assert reg.entry("input_kernel", "ep-binned").provider == "qa-ep"
    assert "dir-only" not in reg.names("input_kernel") and "file-ep" not in reg.names("input_kernel")
    reasons = {f.plugin: f.reason for f in reg.failures}
    assert "registered twice" in reasons["dirclash"]
    assert "entry point qa-ep = qa_ep_mod" in reasons[str(plugins / "qa-ep.py")]
    assert reg.origin("qa-ep").startswith("entry point qa-ep = qa_ep_mod")


def test_a_command_hook_that_raises_skips_the_plugin_whole():
    def kernels(register):
        register("cmd-kernel", Toy)

    def commands(cli):
        @cli.command("half")
        def half():
            """Half-added."""
        raise RuntimeError("boom")

    reg = Registry(load_external=False,
                   extra_plugins=[_plugin("cmdraises", register_input_kernels=kernels, register_commands=commands)])
    group = click.Group()
    reg.register_commands(group)
    assert "half" not in group.commands and "cmd-kernel" not in reg.names("input_kernel")
    assert [f.plugin for f in reg.failures] == ["cmdraises"] and not reg.commands


# -- 6. strict mode says it once ------------------------------------------------------------------------------
def test_strict_mode_clash_message_is_said_once():
    def hook(register):
        register("ppk", Toy)

    with pytest.raises(PluginError) as failed:
        Registry(load_external=False, strict=True, extra_plugins=[_plugin("x", register_input_kernels=hook)])
    assert str(failed.value).count("failed (MOLPREDICT_STRICT_PLUGINS=1)") == 1
    assert str(failed.value).startswith("plugin 'x' failed (MOLPREDICT_STRICT_PLUGINS=1): input_kernel 'ppk'")


# -- 3. only subclasses of the kind's base class --------------------------------------------------------------
@pytest.mark.parametrize("hook, component, expected", [
    ("register_input_kernels", dict, "molpredict.kernels.InputKernel"),
    ("register_sketches", Toy, "molpredict.engine.sketches.Sketch"),
    ("register_output_kernels", Toy, "molpredict.kernels.OutputKernel"),
    ("register_models", Toy, "molpredict.models.base.Model"),
    ("register_regressors", Toy, "molpredict.models.regression.Regressor"),
])
def test_registration_refuses_a_class_of_another_kind(hook, component, expected):
    reg = Registry(load_external=False,
                   extra_plugins=[_plugin("wrongkind", **{hook: lambda register: register("wk", component)})])
    assert [f.plugin for f in reg.failures] == ["wrongkind"]
    reason = reg.failures[0].reason
    assert f"is not a subclass of {expected}" in reason and component.__name__ in reason and "\n" not in reason
    assert not any(e.provider == "wrongkind" for e in reg.entries())


def test_a_lazy_target_of_another_kind_is_refused_when_loaded():
    def hook(register):
        register("lazy-sketch", "molpredict.kernels.spectra:PPKernel")

    reg = Registry(load_external=False, extra_plugins=[_plugin("lazy", register_sketches=hook)])
    with pytest.raises(PluginError, match=r"sketch 'lazy-sketch' from plugin 'lazy' .*PPKernel is not a "
                                          r"subclass of molpredict\.engine\.sketches\.Sketch"):
        reg.get("sketch", "lazy-sketch")


def test_every_builtin_is_a_subclass_of_its_kind():
    reg = Registry(load_external=False)
    for entry in reg.entries():
        assert entry.load().registry_name == entry.name


# -- 4. a class shared by two names ---------------------------------------------------------------------------
@pytest.mark.parametrize("alias_first", [True, False])
def test_an_alias_of_a_builtin_class_never_renames_it(alias_first):
    """A plugin's ``ppk-alias`` of the built-in PPKernel: a kernel built as ``ppk`` records ``ppk`` (a model trained
    with it loads without the plugin), one built as ``ppk-alias`` records the alias, in any order of use."""
    def hook(register):
        register("ppk-alias", "molpredict.kernels.spectra:PPKernel")

    reg = Registry(load_external=False, extra_plugins=[_plugin("alias", register_input_kernels=hook)])
    order = ["ppk-alias", "ppk"] if alias_first else ["ppk", "ppk-alias"]
    classes = {name: reg.get("input_kernel", name) for name in order}
    assert classes["ppk"].registry_name == "ppk" and classes["ppk-alias"].registry_name == "ppk-alias"
    assert reg.create("input_kernel", "ppk").to_spec().name == "ppk"
    alias = reg.create("input_kernel", "ppk-alias")
    assert alias.to_spec().name == "ppk-alias" and isinstance(alias, classes["ppk"])
    assert reg.get("input_kernel", "ppk-alias") is classes["ppk-alias"]  # one class per name: identity holds
    for twin in (pickle.loads(pickle.dumps(alias)), copy.deepcopy(alias)):  # kernel workers unpickle it
        assert type(twin) is type(alias) and twin.registry_name == "ppk-alias"
    assert Registry(load_external=False).get("input_kernel", "ppk").registry_name == "ppk"


def test_one_plugin_class_under_two_names_keeps_each_name():
    def hook(register):
        register("toy-a", Toy)
        register("toy-b", Toy)

    reg = Registry(load_external=False, extra_plugins=[_plugin("two-names", register_input_kernels=hook)])
    a, b = reg.create("input_kernel", "toy-a"), reg.create("input_kernel", "toy-b")
    assert (a.to_spec().name, b.to_spec().name) == ("toy-a", "toy-b")


# -- 5. silent mistakes ---------------------------------------------------------------------------------------
def test_a_hook_that_returns_a_value_is_reported(capsys):
    reg = Registry(load_external=False, extra_plugins=[
        _plugin("wrongreturn", register_input_kernels=lambda register: {"wr-kernel": Toy})])
    assert "wr-kernel" not in reg.names("input_kernel")
    assert len(reg.warnings) == 1 and "register_input_kernels returned a dict" in reg.warnings[0]
    assert "register(name, cls)" in capsys.readouterr().err


def test_a_hook_without_hookimpl_is_reported(tmp_path, monkeypatch):
    directory = _plugins_dir(tmp_path, monkeypatch, nodeco=KERNEL + """
def register_input_kernels(register):
    register("nodeco-kernel", Binned)
""")
    reg = Registry(plugins_dir=directory)
    assert reg.warnings == ["plugin 'nodeco': register_input_kernels has no @hookimpl decorator: it is not called"]


def test_a_plugin_command_never_replaces_a_builtin_one():
    def commands(cli):
        @cli.command("identify")
        def identify():
            """Hijacked."""

        @cli.command("hello")
        def hello():
            """Hello."""

    reg = Registry(load_external=False, extra_plugins=[_plugin("cmdclash", register_commands=commands)])
    group = click.Group()

    @group.command("identify")
    def real_identify():
        """The real one."""

    reg.register_commands(group)
    assert group.commands["identify"] is real_identify and "hello" in group.commands
    assert reg.commands == {"hello": "cmdclash"}
    assert reg.warnings == ["plugin 'cmdclash': command 'identify' not added: the built-in command of that name is "
                            "kept"]


def test_plugins_list_shows_commands_and_where_plugins_came_from(tmp_path, monkeypatch):
    directory = _plugins_dir(tmp_path, monkeypatch, mycmd="""
        import click
        from molpredict.hookspecs import hookimpl
        __version__ = "1.2"
        @hookimpl
        def register_commands(cli):
            @cli.command("hello")
            def hello():
                '''Say hello.'''
        @hookimpl
        def register_sketches(register):
            register("my-sketch", "molpredict.engine.sketches:SubsampleSketch")
    """)
    reg = Registry(plugins_dir=directory)
    reg.register_commands(click.Group())
    reset_registry(reg)
    result = CliRunner().invoke(cli, ["plugins", "list", "--json"])
    rows = {(r["kind"], r["name"]): r for r in json.loads(result.stdout)}
    assert rows[("command", "hello")]["provider"] == "mycmd"
    assert rows[("command", "hello")]["origin"] == rows[("sketch", "my-sketch")]["origin"] == str(tmp_path / "mycmd.py")
    assert rows[("sketch", "subsample")]["origin"] == "built-in"
    table = CliRunner().invoke(cli, ["plugins", "list"]).stdout
    assert ["command", "hello", "mycmd", "1.2"] in [line.split() for line in table.splitlines()]
    assert f"plugin mycmd 1.2: {tmp_path / 'mycmd.py'}" in table


def test_an_encoder_of_another_kind_is_refused():
    reg = Registry(load_external=False, extra_plugins=[
        _plugin("enc", register_encoders=lambda register: register("not-encoder", Toy))])
    assert "is not a subclass of molpredict.engine.encoders.Encoder" in reg.failures[0].reason
