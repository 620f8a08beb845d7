"""Modules imported on first use: ``torch = lazy_module("torch")`` at the top of a module that needs torch only in
some of its functions (fitting, a GPU path) keeps it out of the start-up of everything else (``molpredict
identify`` with a kernel model never imports it; ``tests/test_imports.py`` checks which commands do)."""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = ["lazy_module"]


class _LazyModule:
    """Stands for a module; the first attribute read imports it (``sys.modules`` is untouched until then)."""

    def __init__(self, name: str) -> None:
        self.__dict__["_name"] = name
        self.__dict__["_module"] = None

    def _load(self) -> ModuleType:
        module = self.__dict__["_module"]
        if module is None:
            module = self.__dict__["_module"] = importlib.import_module(self.__dict__["_name"])
        return module

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._load(), attr)

    def __repr__(self) -> str:
        state = "imported" if self.__dict__["_module"] is not None else "not imported yet"
        return f"<lazy module {self.__dict__['_name']!r} ({state})>"


def lazy_module(name: str) -> Any:
    """A stand-in for module ``name`` that imports it on the first attribute access (``torch.float64``)."""
    return _LazyModule(name)
