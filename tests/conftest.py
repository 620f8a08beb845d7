"""Shared fixtures: the ../shared/data location (fail, not skip, under CI=true), plugin isolation."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

# Installed third-party plugins must never leak into the tests (test_registry.py checks this holds).
os.environ["MOLPREDICT_LOAD_PLUGINS"] = ""
os.environ.pop("MOLPREDICT_PLUGINS_DIR", None)
os.environ.pop("MOLPREDICT_STRICT_PLUGINS", None)
# ... nor the developer's own defaults (`molpredict config set`, MOLPREDICT_LIBRARY / MOLPREDICT_MODEL): tests pass
# libraries and models explicitly, and the config file is one that does not exist (tests of `config set` point
# MOLPREDICT_CONFIG or MOLPREDICT_HOME at their tmp_path).
os.environ.pop("MOLPREDICT_LIBRARY", None)
os.environ.pop("MOLPREDICT_MODEL", None)
os.environ["MOLPREDICT_CONFIG"] = os.path.join(__import__("tempfile").gettempdir(),
                                               f"molpredict-test-no-config-{os.getpid()}", "config.json")
# ... nor write into the developer's cache (loading a bundle remembers its tensors' hash there): a throw-away home
# (tests of the default location set their own).
os.environ["MOLPREDICT_HOME"] = os.path.join(__import__("tempfile").gettempdir(), f"molpredict-test-home-{os.getpid()}")

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("MOLPREDICT_SHARED_DATA", PROJECT_ROOT.parent / "shared" / "data"))
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def load_benchmark(name: str):
    """Import ``benchmarks/<name>.py`` (not a package) as a module named ``benchmark_<name>``."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", PROJECT_ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def child_pythonpath(first: Path = PROJECT_ROOT) -> str:
    """``PYTHONPATH`` for a child Python process: ``first`` (the checkout) ahead of the caller's own entries, so that
    packages put on ``PYTHONPATH`` rather than installed (a device machine's carried wheels) stay importable there."""
    rest = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    return os.pathsep.join([str(first), *rest])


def require_shared(*relative: str) -> Path:
    """Path under ../shared/data; skips when absent locally, fails when CI=true (CI always has it)."""
    path = SHARED_DATA.joinpath(*relative)
    if not path.exists():
        message = f"shared data not found: {path}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture
def shared_data() -> Path:
    """The ../shared/data directory."""
    return require_shared()


@pytest.fixture(autouse=True)
def _fresh_registry():
    """Each test sees a registry built from the built-ins only (and its own throw-away plugins)."""
    from molpredict.registry import reset_registry
    reset_registry()
    yield
    reset_registry()


@pytest.fixture(autouse=True)
def _eigensolver_threads_fixed(monkeypatch):
    """The CPU eigensolver on one thread whatever the machine's load. ``linalg.symmetric_eigh`` takes all BLAS
    threads when the load average leaves a core free, and LAPACK's sums round differently on one thread than on
    two (8.9e-7 in a SISOKR's W_): tests that fit twice and compare the bits would then pass or fail with the
    load of the machine running them. ``test_basis`` sets it both ways itself."""
    import molpredict.engine.linalg as linalg
    monkeypatch.setattr(linalg, "_cores_free", lambda: False)


def cuda_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="no CUDA device")
    if not cuda_available():
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip_cuda)


@pytest.fixture
def one_torch_thread():
    """torch on one thread: the tests' networks and products are tiny, so thread start-up dominates and extra
    threads only spin (and crawl on an oversubscribed CI machine)."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
