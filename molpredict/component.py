"""The ``Component`` base: sklearn-style parameters (``__init__`` stores them), introspection and specs."""
from __future__ import annotations

import inspect
from typing import Any, ClassVar

from molpredict.specs import ComponentSpec, format_value

__all__ = ["Component", "frozen_spec"]


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


def frozen_spec(component: Component) -> ComponentSpec:
    """The spec of a fitted component with its data-dependent parameters resolved.

    A parameter ``p`` given as e.g. ``"auto"`` and resolved at fit time into a fitted attribute ``p_``
    (``gamma='auto'`` -> ``gamma_``) is written with the resolved value, so that the component rebuilt from the
    spec and fitted on other objects (the landmarks, when a model is reloaded) computes the same function.
    """
    spec = component.to_spec()
    params = dict(spec.params)
    for name in component.param_names():
        resolved = getattr(component, name + "_", None)
        if hasattr(resolved, "item") and callable(resolved.item):  # a numpy scalar
            resolved = resolved.item()
        if isinstance(resolved, (bool, int, float, str)):
            params[name] = resolved
    return ComponentSpec(spec.name, params)
