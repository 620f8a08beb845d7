"""Where the linear algebra runs: the one place that decides between CPU and GPU, and which float type.

Kernel matrices are computed in numpy (float64) and moved to the resolved device for the linear algebra;
every model asks :func:`resolve_device` instead of testing ``torch.cuda.is_available()`` itself.
"""
from __future__ import annotations

from molpredict.errors import ResourceError, SpecError
from molpredict.lazy import lazy_module

torch = lazy_module("torch")  # imported when a device or dtype is resolved (fitting), not to predict

__all__ = ["resolve_device", "resolve_dtype", "DTYPES"]

#: names accepted by :func:`resolve_dtype` -> the name of the torch dtype they stand for
DTYPES: dict[str, str] = {
    "float64": "float64",
    "double": "float64",
    "float32": "float32",
    "float": "float32",
}


def resolve_device(spec: "str | torch.device | None" = "auto") -> torch.device:
    """The torch device named by ``spec``.

    Parameters
    ----------
    spec : {"auto", "cpu", "cuda", "cuda:<index>"} or torch.device or None
        ``"auto"`` (or None): the first CUDA device when one is present, else the CPU.

    Raises
    ------
    ResourceError
        A CUDA device is asked for and none (or not that index) is present.
    SpecError
        ``spec`` is not a device name.
    """
    if isinstance(spec, torch.device):
        spec = str(spec)
    text = "auto" if spec is None else str(spec).strip().lower()
    if text == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if text == "cpu":
        return torch.device("cpu")
    if text == "cuda" or text.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ResourceError(f"device {text!r} requested but no CUDA device is available (use --device cpu)")
        try:
            device = torch.device(text)
        except RuntimeError:
            raise SpecError(f"device {spec!r} is not a device name (auto, cpu, cuda, cuda:N)") from None
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ResourceError(f"device {text!r} requested but only {torch.cuda.device_count()} CUDA device(s) "
                                "are available")
        return device
    raise SpecError(f"device {spec!r} is not a device name (auto, cpu, cuda, cuda:N)")


def resolve_dtype(name: "str | torch.dtype" = "float64") -> torch.dtype:
    """The torch float type named ``name`` (``float64``/``double`` or ``float32``/``float``).

    Raises
    ------
    SpecError
        Any other name.
    """
    if isinstance(name, torch.dtype):
        if name in (torch.float64, torch.float32):
            return name
        raise SpecError(f"dtype {name} is not supported; valid: float64, float32")
    try:
        return getattr(torch, DTYPES[str(name).strip().lower()])
    except KeyError:
        raise SpecError(f"dtype {name!r} is not supported; valid: {', '.join(DTYPES)}") from None
