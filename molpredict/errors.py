"""The exception hierarchy: every error a user can cause is a ``MolpredictError`` with a one-line message."""
from __future__ import annotations

__all__ = [
    "MolpredictError",
    "InputError",
    "SpecError",
    "PluginError",
    "ModelFileError",
    "ResourceError",
    "one_line_warning",
]


class MolpredictError(Exception):
    """Base class. The CLI prints ``str(error)`` on one line and exits with ``exit_code``."""

    exit_code = 1


class InputError(MolpredictError):
    """Bad user input: a file that is not what it claims to be, or a bad record or field in it.

    Parameters
    ----------
    message : str
        What is wrong.
    path : str, optional
        The file concerned.
    record : int or str, optional
        The record (1-based index or identifier) concerned.
    field : str, optional
        The field concerned.
    """

    exit_code = 2

    def __init__(self, message: str, path: str | None = None, record: int | str | None = None,
                 field: str | None = None) -> None:
        self.message = message
        self.path = None if path is None else str(path)
        self.record = record
        self.field = field
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.path is not None:
            where.append(self.path)
        if self.record is not None:
            where.append(f"record {self.record}")
        if self.field is not None:
            where.append(f"field {self.field}")
        return (": ".join([", ".join(where), self.message]) if where else self.message).replace("\n", " ")


class SpecError(MolpredictError):
    """A component spec (``name:key=value``) names an unknown component or parameter, or a bad value."""

    exit_code = 2


class PluginError(MolpredictError):
    """A plugin failed to load, registered a duplicate name, or is missing for a saved model."""

    exit_code = 3


class ModelFileError(MolpredictError):
    """A model bundle is missing, corrupted, truncated, or from an incompatible format version."""

    exit_code = 4


class ResourceError(MolpredictError):
    """A computation would exceed a memory budget or needs a device that is not present."""

    exit_code = 5


def one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A ``warnings.showwarning`` for the command line: warnings as the errors are shown, one line on stderr,
    without Python's source file and line (the message names the input concerned)."""
    import sys

    text = " ".join(str(message).split())
    kind = "" if issubclass(category, UserWarning) else f"{category.__name__}: "
    print(f"molpredict: warning: {kind}{text}", file=sys.stderr if file is None else file)
