"""The ``Component`` base: sklearn-style parameters (``__init__`` stores them), introspection and specs."""
from __future__ import annotations

import inspect
from typing import Any, ClassVar

from .specs import ComponentSpec, format_value

__all__ = ["Component"]


class Component:
    """Base of kernels, sketches, models and encoders.

    ``__init__`` only stores its keyword parameters under attributes of the same name; fitted state is
    stored in attributes ending in ``_``. ``registry_name`` is set by the registry when the class is looked up
    by name, so that a fitted component can be saved as a spec and rebuilt from it.
    """

    registry_name: ClassVar[str | None] = None

    @classmethod
    def param_names(cls) -> list[str]:
        """The names of the parameters ``__init__`` accepts (all keyword parameters)."""
        sig = inspect.signature(cls.__init__)
        return [p.name for p in sig.parameters.values()
                if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]

    def get_params(self) -> dict[str, Any]:
        """Parameters as passed to ``__init__`` (read from the attributes of the same names)."""
        return {name: getattr(self, name) for name in self.param_names()}

    def to_spec(self) -> ComponentSpec:
        """The spec that rebuilds this component (parameters that are not JSON scalars are skipped)."""
        params = {k: v for k, v in self.get_params().items()
                  if v is None or isinstance(v, (bool, int, float, str))}
        return ComponentSpec(self.registry_name or type(self).__name__, params)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={format_value(v)}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"
