"""MS/MS spectra cleaning: pure steps ``Spectrum -> Spectrum | None`` and the serialisable :class:`CleaningPipeline`.

Cleaning steps never modify their input; a result may share unchanged arrays with it, so treat spectra as
immutable. :class:`CleaningPipeline` chains them with serialisable settings.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from molpredict.errors import SpecError
from molpredict.spectra.record import Spectrum, spectrum_ion_mode

__all__ = [
    "CleaningPipeline",
    "filter_ms_level",
    "select_mz_range",
    "remove_precursor_peak",
    "merge_close_peaks",
    "filter_relative_intensity",
    "keep_top_peaks",
    "transform_intensities",
    "normalize_intensities",
    "count_empty",
]


# -- cleaning: pure functions ---------------------------------------------------------------------------------
# Each public step has an array-level core (``_..._arrays``) that CleaningPipeline chains directly, so that a
# pipeline builds one Spectrum per call instead of one per step.

Peaks = tuple[np.ndarray, np.ndarray]


def filter_ms_level(spectrum: Spectrum, level: int = 2) -> Spectrum | None:
    """The spectrum when its MS level is ``level``, else None."""
    return spectrum if spectrum.ms_level == level else None


def _upper_bound(precursor_mz: float | None, mz_max: float | None, precursor_margin: float | None) -> float:
    upper = np.inf if mz_max is None else float(mz_max)
    if precursor_margin is not None and precursor_mz is not None:
        upper = min(upper, precursor_mz + precursor_margin)
    return upper


def select_mz_range(spectrum: Spectrum, mz_min: float = 0.0, mz_max: float | None = None,
                    precursor_margin: float | None = None) -> Spectrum:
    """Keep the peaks with ``mz_min <= m/z <= upper``.

    Parameters
    ----------
    spectrum : Spectrum
    mz_min : float, default 0.0
    mz_max : float, optional
        Absolute upper bound.
    precursor_margin : float, optional
        Relative upper bound ``precursor_mz + precursor_margin`` (Da), ignored when the precursor is unknown.
        With both bounds, the smaller one applies.
    """
    mz = spectrum.mz
    keep = (mz >= mz_min) & (mz <= _upper_bound(spectrum.precursor_mz, mz_max, precursor_margin))
    if keep.all():
        return spectrum
    return spectrum.with_peaks(mz[keep], spectrum.intensities[keep])


def remove_precursor_peak(spectrum: Spectrum, tolerance: float = 0.02) -> Spectrum:
    """Remove every peak within ``tolerance`` Da of the precursor m/z (nothing when the precursor is unknown)."""
    if spectrum.precursor_mz is None:
        return spectrum
    keep = np.abs(spectrum.mz - spectrum.precursor_mz) > tolerance
    if keep.all():
        return spectrum
    return spectrum.with_peaks(spectrum.mz[keep], spectrum.intensities[keep])


def _merge_arrays(mz: np.ndarray, intensities: np.ndarray, tolerance: float) -> Peaks:
    if mz.shape[0] < 2:
        return mz, intensities
    split = (mz[1:] - mz[:-1]) >= tolerance
    if split.all():
        return mz, intensities
    group = np.zeros(mz.shape[0], dtype=np.intp)
    np.cumsum(split, out=group[1:])
    n_groups = int(group[-1]) + 1
    total = np.bincount(group, weights=intensities, minlength=n_groups)
    weighted = np.bincount(group, weights=intensities * mz, minlength=n_groups)
    plain = np.bincount(group, weights=mz, minlength=n_groups) / np.bincount(group, minlength=n_groups)
    positive = total > 0
    merged_mz = np.where(positive, weighted / np.where(positive, total, 1.0), plain)
    return merged_mz, total


def merge_close_peaks(spectrum: Spectrum, tolerance: float = 0.002) -> Spectrum:
    """Merge runs of peaks whose consecutive m/z gaps are below ``tolerance`` Da into one peak each.

    A merged peak has the summed intensity and the intensity-weighted mean m/z of its run (the plain mean
    when the run's intensities are all zero). Runs chain: three peaks 0.0015 Da apart merge into one with
    ``tolerance=0.002``.
    """
    mz, intensities = _merge_arrays(spectrum.mz, spectrum.intensities, tolerance)
    return spectrum if mz is spectrum.mz else spectrum.with_peaks(mz, intensities)


def _floor_arrays(mz: np.ndarray, intensities: np.ndarray, min_relative: float) -> Peaks:
    if intensities.shape[0] == 0 or min_relative <= 0:
        return mz, intensities
    keep = (intensities >= min_relative * intensities.max()) & (intensities > 0)
    if keep.all():
        return mz, intensities
    return mz[keep], intensities[keep]


def filter_relative_intensity(spectrum: Spectrum, min_relative: float = 0.01) -> Spectrum:
    """Keep the peaks with intensity >= ``min_relative`` times the spectrum's largest (and > 0 when the floor
    is positive)."""
    mz, intensities = _floor_arrays(spectrum.mz, spectrum.intensities, min_relative)
    return spectrum if mz is spectrum.mz else spectrum.with_peaks(mz, intensities)


def _top_arrays(mz: np.ndarray, intensities: np.ndarray, n: int) -> Peaks:
    if mz.shape[0] <= n:
        return mz, intensities
    order = np.argsort(-intensities, kind="stable")[:n]
    order.sort()
    return mz[order], intensities[order]


def keep_top_peaks(spectrum: Spectrum, n: int = 100) -> Spectrum:
    """Keep the ``n`` most intense peaks (ties broken towards lower m/z), still sorted by m/z."""
    mz, intensities = _top_arrays(spectrum.mz, spectrum.intensities, n)
    return spectrum if mz is spectrum.mz else spectrum.with_peaks(mz, intensities)


_TRANSFORMS = {
    "none": None,
    "sqrt": np.sqrt,
    "log1p": np.log1p,
}


def transform_intensities(spectrum: Spectrum, transform: str = "sqrt") -> Spectrum:
    """Apply ``"sqrt"``, ``"log1p"`` or ``"none"`` to the intensities (compresses their dynamic range)."""
    if transform not in _TRANSFORMS:
        raise SpecError(f"unknown intensity transform {transform!r} (expected one of {', '.join(_TRANSFORMS)})")
    function = _TRANSFORMS[transform]
    if function is None:
        return spectrum
    return spectrum.with_peaks(spectrum.mz, function(spectrum.intensities))


_NORMS = {"max": np.ndarray.max, "sum": np.ndarray.sum, "l2": lambda a: np.sqrt(a @ a), "none": None}


def _normalize_array(intensities: np.ndarray, norm: str) -> np.ndarray:
    function = _NORMS[norm]
    if function is None or intensities.shape[0] == 0:
        return intensities
    scale = function(intensities)
    return intensities / scale if scale > 0 else intensities


def normalize_intensities(spectrum: Spectrum, norm: str = "max") -> Spectrum:
    """Scale the intensities so that their max (``"max"``), sum (``"sum"``) or Euclidean norm (``"l2"``) is 1.

    A spectrum without peaks or with all-zero intensities is returned unchanged.
    """
    if norm not in _NORMS:
        raise SpecError(f"unknown intensity normalisation {norm!r} (expected one of {', '.join(_NORMS)})")
    intensities = _normalize_array(spectrum.intensities, norm)
    return spectrum if intensities is spectrum.intensities else spectrum.with_peaks(spectrum.mz, intensities)


def count_empty(spectra: Iterable[Spectrum | None]) -> int:
    """Number of spectra left with no peak (e.g. after cleaning); None entries are not counted."""
    return sum(1 for s in spectra if s is not None and s.n_peaks == 0)


# -- cleaning: the pipeline -----------------------------------------------------------------------------------

@dataclass
class CleaningPipeline:
    """Spectrum cleaning with stored settings, applied in a fixed order by ``pipeline(spectrum)``.

    Order: MS-level filter, m/z range, precursor-peak removal, merging of close peaks, relative-intensity
    floor, top-N peaks, intensity transform, normalisation. The floor is relative to the largest peak left
    after precursor removal (so that a dominant precursor does not wipe out the fragments), and close peaks
    are merged before the floor and top-N so that a split ion counts once.

    The defaults suit the probability product kernel (``ppk``, ``ppk-losses``) on MassBank data, whose m/z
    are given to 0.0001-0.01 Da (a few low-resolution records to 0.1 Da):

    - ``precursor_margin=0.5``: fragments cannot exceed the precursor; peaks above it are isotopes of the
      precursor or co-isolated ions, and would give negative neutral losses.
    - ``precursor_tolerance=0.02``: the precursor peak carries only the precursor mass, which every candidate
      (chosen by formula or mass) shares, and dominates many low-energy spectra; removed, the intensity
      floor and the normalisation follow the fragments. Spectra that held only the precursor end up empty:
      the kernels give them similarity 0 with everything (``count_empty`` says how many).
    - ``merge_tolerance=0.002``: below the kernel's m/z width (``s_mz`` ~ 0.003-0.01 Da), split peaks of one
      ion would otherwise be counted twice.
    - ``min_relative_intensity=0.01`` and ``max_peaks=100``: noise removal and a cap on the PPK's cost
      (quadratic in peaks per pair of spectra); MassBank training spectra have a median of 13 peaks
      (mean 32, 1% above 287); the defaults leave a median of 10 and a mean of 19.
    - ``transform="sqrt"`` and ``normalize="max"``: the square root lets medium peaks count (raw intensities
      are dominated by one or two peaks); max = 1 puts every spectrum on the scale the PPK's intensity width
      ``s_I`` is chosen on.

    Parameters
    ----------
    ms_level : int or None, default 2
        Spectra of another level give None; None keeps all levels.
    mz_min : float, default 0.0
    mz_max : float or None, default None
        Absolute upper m/z bound.
    precursor_margin : float or None, default 0.5
        Upper bound ``precursor_mz + precursor_margin`` Da; None for no relative bound.
    precursor_tolerance : float or None, default 0.02
        Remove peaks within this many Da of the precursor m/z; None keeps them.
    merge_tolerance : float or None, default 0.002
        Merge peaks closer than this (Da); None or 0 disables merging.
    min_relative_intensity : float, default 0.01
        Drop peaks below this fraction of the largest; 0 disables.
    max_peaks : int or None, default 100
        Keep at most this many of the most intense peaks; None for no cap.
    transform : {"sqrt", "log1p", "none"}, default "sqrt"
    normalize : {"max", "sum", "l2", "none"}, default "max"
    """

    ms_level: int | None = 2
    mz_min: float = 0.0
    mz_max: float | None = None
    precursor_margin: float | None = 0.5
    precursor_tolerance: float | None = 0.02
    merge_tolerance: float | None = 0.002
    min_relative_intensity: float = 0.01
    max_peaks: int | None = 100
    transform: str = "sqrt"
    normalize: str = "max"

    #: version of the :meth:`to_dict` layout
    format_version = 1

    def __post_init__(self) -> None:
        if self.transform not in _TRANSFORMS:
            raise SpecError(f"cleaning: unknown transform {self.transform!r} "
                            f"(expected one of {', '.join(_TRANSFORMS)})")
        if self.normalize not in _NORMS:
            raise SpecError(f"cleaning: unknown normalize {self.normalize!r} (expected one of {', '.join(_NORMS)})")
        for name in ("mz_min", "mz_max", "precursor_margin", "precursor_tolerance", "merge_tolerance",
                     "min_relative_intensity"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                      or not np.isfinite(value) or (value < 0 and name != "precursor_margin")):
                raise SpecError(f"cleaning: {name} must be a finite non-negative number, got {value!r}")
        if self.max_peaks is not None and (not isinstance(self.max_peaks, int) or isinstance(self.max_peaks, bool)
                                           or self.max_peaks < 1):
            raise SpecError(f"cleaning: max_peaks must be a positive integer or None, got {self.max_peaks!r}")
        if self.ms_level is not None and (not isinstance(self.ms_level, int) or isinstance(self.ms_level, bool)):
            raise SpecError(f"cleaning: ms_level must be an integer or None, got {self.ms_level!r}")

    def __call__(self, spectrum: Spectrum) -> Spectrum | None:
        """The cleaned spectrum (possibly with zero peaks), or None when its MS level is filtered out."""
        if self.ms_level is not None and spectrum.ms_level != self.ms_level:
            return None
        mz, intensities = spectrum.mz, spectrum.intensities
        # The same steps as the public functions, on arrays: one Spectrum is built at the end.
        keep = (mz >= self.mz_min) & (mz <= _upper_bound(spectrum.precursor_mz, self.mz_max,
                                                         self.precursor_margin))
        if self.precursor_tolerance is not None and spectrum.precursor_mz is not None:
            keep &= np.abs(mz - spectrum.precursor_mz) > self.precursor_tolerance
        if not keep.all():
            mz, intensities = mz[keep], intensities[keep]
        if self.merge_tolerance:
            mz, intensities = _merge_arrays(mz, intensities, self.merge_tolerance)
        mz, intensities = _floor_arrays(mz, intensities, self.min_relative_intensity)
        if self.max_peaks is not None:
            mz, intensities = _top_arrays(mz, intensities, self.max_peaks)
        transform = _TRANSFORMS[self.transform]
        if transform is not None:
            intensities = transform(intensities)
        intensities = _normalize_array(intensities, self.normalize)
        if mz is spectrum.mz and intensities is spectrum.intensities:
            return spectrum
        return spectrum.with_peaks(mz, intensities)

    def clean_or_reason(self, spectrum: Spectrum) -> Spectrum | str:
        """The cleaned spectrum, or why training cannot use it: another MS level, or no peak left (the reasons
        ``train`` counts and ``spectra info`` foresees)."""
        cleaned = self(spectrum)
        if cleaned is None:
            return f"MS level {spectrum.ms_level} (not {self.ms_level})"
        if cleaned.n_peaks == 0:
            return "no peaks after cleaning"
        return cleaned

    def apply(self, spectra: Iterable[Spectrum]) -> Iterator[Spectrum]:
        """Clean a stream of spectra, dropping those the MS-level filter rejects (empty ones are kept)."""
        for spectrum in spectra:
            cleaned = self(spectrum)
            if cleaned is not None:
                yield cleaned

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable settings: ``{"format_version": 1, <field>: <value>, ...}``."""
        return {"format_version": self.format_version, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CleaningPipeline":
        """Inverse of :meth:`to_dict`; missing fields take their defaults.

        Raises
        ------
        SpecError
            An unknown field, a bad value, or a newer ``format_version``.
        """
        data = dict(data)
        version = data.pop("format_version", cls.format_version)
        if not isinstance(version, int) or version > cls.format_version:
            raise SpecError(f"cleaning: unsupported format_version {version!r} (this molpredict reads "
                            f"<= {cls.format_version})")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"cleaning: unknown setting(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        return cls(**data)
