"""Output paths checked before any work: each in a folder that exists and can be written, and no two of a command's
outputs (or an output and an input) naming the same file, which would silently overwrite one with the other."""
from __future__ import annotations

import os
from pathlib import Path

from molpredict.errors import InputError

__all__ = ["check_output_files", "check_plot_file", "check_input_files", "plot_formats", "PLOT_FORMATS"]


def _same_file_key(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))  # symlinks and ./ spellings of one file compare equal


def check_output_files(outputs: dict[str, str | None], inputs: dict[str, str | None] | None = None,
                       folders: dict[str, str | None] | None = None) -> None:
    """Raise the one-line :class:`InputError` before a command starts work when an output file cannot be written
    where it is asked for, or would overwrite an input or another output.

    Parameters
    ----------
    outputs : dict
        Option name (``"-o"``, ``"--skipped"``) -> file path; None and ``-`` (stdout) are not checked.
    inputs : dict, optional
        Argument or option name -> input file path (None and ``-`` ignored).
    folders : dict, optional
        Option name -> an input folder (a model bundle) that no output may be written into.
    """
    taken: dict[str, str] = {}
    for name, path in (inputs or {}).items():
        if path and path != "-":
            taken[_same_file_key(path)] = name
    for name, path in outputs.items():
        if not path or path == "-":
            continue
        folder = Path(path).parent
        if not folder.is_dir():
            raise InputError(f"the folder {folder} does not exist", path=path, field=name)
        if Path(path).is_dir():
            raise InputError("is a folder, not a file", path=path, field=name)
        if not os.access(folder, os.W_OK):
            raise InputError(f"the folder {folder} cannot be written", path=path, field=name)
        key = _same_file_key(path)
        if key in taken:
            raise InputError(f"is also {taken[key]}: it would be overwritten", path=path, field=name)
        taken[key] = name
        for folder_name, input_folder in (folders or {}).items():
            if input_folder and key.startswith(_same_file_key(input_folder) + os.sep):
                raise InputError(f"is inside {folder_name} {input_folder}: it would change it", path=path,
                                 field=name)


#: what matplotlib's default backends write (``FigureCanvasBase.get_supported_filetypes()``), for when matplotlib is
#: not installed: the extension is still checked before any work
PLOT_FORMATS = ("eps", "jpeg", "jpg", "pdf", "pgf", "png", "ps", "raw", "rgba", "svg", "svgz", "tif", "tiff", "webp")


def plot_formats() -> list[str]:
    """The file formats a plot can be written in: matplotlib's own list when it is installed, else
    :data:`PLOT_FORMATS`."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        return sorted(PLOT_FORMATS)
    return sorted(FigureCanvasBase.get_supported_filetypes())


def check_plot_file(path: str | None, option: str = "--plot") -> None:
    """Raise the one-line :class:`InputError` (naming ``option``) before a command starts work when the plot file's
    extension is not a format matplotlib writes (the format is taken from it), and the
    :class:`~molpredict.errors.ResourceError` when matplotlib is not installed, rather than after the work, which
    the failure would lose."""
    if not path:
        return
    formats = plot_formats()
    suffix = Path(path).suffix
    fmt = suffix[1:].lower()
    if not fmt:
        raise InputError(f"no file extension to take the plot's format from (one of: {', '.join(formats)})",
                         path=path, field=option)
    if fmt not in formats:
        raise InputError(f"format {fmt!r} is not supported (one of: {', '.join(formats)})", path=path, field=option)
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        from molpredict.errors import ResourceError
        raise ResourceError(f"{option} needs matplotlib: pip install 'molpredict[plot]'")


def check_input_files(inputs: dict[str, str | list[str] | tuple[str, ...] | None]) -> None:
    """Raise the one-line :class:`InputError` ``PATH, field OPTION: no such file`` before a command starts work when
    an input file it reads only later (after the training data, say) does not exist or is a folder."""
    for name, paths in inputs.items():
        for path in [paths] if isinstance(paths, str) else list(paths or ()):
            if not path or path == "-":
                continue
            if Path(path).is_dir():
                raise InputError("is a folder, not a file", path=path, field=name)
            if not Path(path).exists():
                raise InputError("no such file", path=path, field=name)
