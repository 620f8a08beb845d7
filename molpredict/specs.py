"""Component specs: the one syntax that names a component and its parameters, ``name:key=value,key=value``.

A value written ``a|b|c`` is a grid to be searched on validation data.

Examples
--------
>>> spec = parse_spec("p-sparsified-rademacher:m=800,p=0.0005")
>>> spec.name, spec.params
('p-sparsified-rademacher', {'m': 800, 'p': 0.0005})
>>> [str(s) for s in parse_spec("gaussian-tanimoto:gamma=0.5|1").expand()]
['gaussian-tanimoto:gamma=0.5', 'gaussian-tanimoto:gamma=1']
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from molpredict.errors import SpecError

__all__ = ["Grid", "ComponentSpec", "nested_spec", "parse_spec", "parse_value", "parse_values", "format_value",
           "is_no_sketch"]


@dataclass(frozen=True)
class Grid:
    """A list of candidate values for one parameter, written ``a|b|c``."""

    values: tuple[Any, ...]

    def __str__(self) -> str:
        return "|".join(format_value(v) for v in self.values)


def parse_value(text: str) -> Any:
    """Parse one scalar value: int, float, bool (``true``/``false``), ``none``, else the string itself."""
    text = text.strip()
    low = text.lower()
    if low in ("true", "yes"):
        return True
    if low in ("false", "no"):
        return False
    if low in ("none", "null"):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_values(text: str) -> Any:
    """Parse a value that may be a grid: ``"0.1|1"`` gives ``Grid((0.1, 1))``, ``"0.1"`` gives ``0.1``."""
    if "|" in text:
        return Grid(tuple(parse_value(part) for part in text.split("|")))
    return parse_value(text)


def format_value(value: Any) -> str:
    """The inverse of :func:`parse_value` (floats in ``repr`` form so that they round-trip exactly)."""
    if isinstance(value, Grid):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, float):
        return repr(value)
    return str(value)


@dataclass(frozen=True)
class ComponentSpec:
    """A parsed component spec.

    Attributes
    ----------
    name : str
        The registry name.
    params : dict
        Parameter values; a :class:`Grid` marks a parameter to be searched.
    texts : dict
        The text each value was parsed from (a grid's: ``a|b``), for the parameters :func:`parse_spec` read: a
        parameter that takes text gets that text, not the number or boolean it looks like (``mode=inf``), and
        ``str`` writes it as given, so that the spec passed on as a string keeps it.
    """

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_grid(self) -> bool:
        return any(isinstance(v, Grid) for v in self.params.values())

    def expand(self) -> list["ComponentSpec"]:
        """All grid points (the cartesian product of the grids), in order; ``[self]`` when there is no grid."""
        keys = list(self.params)
        choices = [v.values if isinstance(v, Grid) else (v,) for v in self.params.values()]
        # each grid point keeps the text of its own alternative (a grid's text is its alternatives' joined by |)
        texts = [[t.strip() for t in self.texts[k].split("|")] if k in self.texts and isinstance(v, Grid)
                 else [self.texts.get(k)] * len(choice) for (k, v), choice in zip(self.params.items(), choices)]
        return [ComponentSpec(self.name, dict(zip(keys, combo)),
                              {k: t for k, t in zip(keys, text) if t is not None})
                for combo, text in zip(itertools.product(*choices), itertools.product(*texts))]

    def __str__(self) -> str:
        if not self.params:
            return self.name
        return self.name + ":" + ",".join(f"{k}={self._written(k, v)}" for k, v in self.params.items())

    def _written(self, key: str, value: Any) -> str:
        """How ``str`` writes parameter ``key``: the text it was parsed from while that still reads as ``value``
        (a parameter the component takes as text gets that text from the registry, so ``mode=1e3`` must stay
        ``1e3``, not become ``1000.0``, when a spec is passed on as a string), else :func:`format_value`."""
        text = self.texts.get(key)
        if text is not None and format_value(parse_values(text)) == format_value(value):
            return text
        return format_value(value)


def is_no_sketch(spec: Any) -> bool:
    """Whether a sketch spec means no sketch: None, empty, ``none`` or ``identity`` (any case), which
    :func:`~molpredict.engine.sketches.make_sketch` turns into the identity; not a registered name."""
    return spec is None or str(spec).strip().lower() in ("", "none", "identity")


def nested_spec(text: Any) -> str:
    """A component spec given as a parameter of another spec writes its own parameters with ``;``
    (``dsokr:encoder=mlp:hidden=256;layers=3``); this restores the ``,`` that :func:`parse_spec` reads."""
    return str(text).replace(";", ",")


def parse_spec(text: "str | ComponentSpec") -> ComponentSpec:
    """Parse ``name`` or ``name:key=value,key=value`` (values may be ``a|b|c`` grids).

    Raises
    ------
    SpecError
        On an empty name, a parameter without ``=``, or a repeated key.
    """
    if isinstance(text, ComponentSpec):
        return text
    text = str(text).strip()
    name, _, rest = text.partition(":")
    name = name.strip()
    if not name:
        raise SpecError(f"component spec {text!r}: missing name (expected name:key=value,...)")
    params: dict[str, Any] = {}
    texts: dict[str, str] = {}
    if rest.strip():
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key = key.strip().replace("-", "_")
            if not eq or not key:
                raise SpecError(f"component spec {text!r}: {item.strip()!r} is not key=value")
            if key in params:
                raise SpecError(f"component spec {text!r}: parameter {key!r} given twice")
            params[key] = parse_values(value)
            texts[key] = value.strip()
    return ComponentSpec(name, params, texts)
