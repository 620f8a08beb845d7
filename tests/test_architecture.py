"""The package's shape: stages that import downward only, and no import cycles between modules, counting imports
inside functions and type-only imports too."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "molpredict"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (module level, in a function or under TYPE_CHECKING).

    ``from . import x`` counts as importing the submodule ``x`` (not the package, already being imported)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
                subs = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
                targets = subs or [base]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Components of more than one module (Tarjan), i.e. the import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert strongly_connected(import_graph()) == []


#: The stages, lowest first: a module may import its own stage and the stages before it, never a later one.
STAGES = ["core", "spectra", "chem", "io", "kernels", "engine", "models", "bundles", "properties", "identification", "training",
          "report", "data", "testing", "api", "cli"]
#: top-level modules by stage (everything else: its subpackage is its stage)
TOP_LEVEL = {"errors": "core", "specs": "core", "component": "core", "hookspecs": "core", "registry": "core",
             "builtins": "core", "cache": "core", "atomic": "core", "lazy": "core", "modelfile": "bundles",
             "config": "bundles", "api": "api", "__main__": "cli"}


def stage_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "core"  # the package itself: errors, specs and the registry eagerly; the API lazily
    return TOP_LEVEL.get(parts[1], parts[1])


def test_every_module_has_a_stage():
    assert {stage_of(m) for m in import_graph()} <= set(STAGES)


def test_the_top_level_holds_at_most_twelve_modules():
    modules = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(modules) <= 12, modules
    assert set(modules) <= set(TOP_LEVEL), "give a new top-level module a stage in TOP_LEVEL"


def test_imports_flow_downward():
    upward = [f"{m} ({stage_of(m)}) -> {d} ({stage_of(d)})" for m, deps in import_graph().items() for d in deps
              if STAGES.index(stage_of(d)) > STAGES.index(stage_of(m))]
    assert upward == []


def test_each_stage_says_what_it_owns_and_may_import():
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        if init.parent.name in ("spectra", "chem", "engine", "properties", "identification", "training", "report",
                                "data"):
            assert doc.startswith("Stage:") and "May import" in doc, init


def test_the_stage_check_sees_an_upward_import():
    graph = import_graph()
    assert "molpredict.identification.candidate_sources" in graph["molpredict.identification.identify"]
    assert STAGES.index(stage_of("molpredict.training.pipeline")) > STAGES.index(
        stage_of("molpredict.identification.identify"))


def test_the_cycle_finder_finds_a_cycle():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = import_graph()
    assert "molpredict.spectra.record" in graph["molpredict.io.mgf"]  # the readers build the record
