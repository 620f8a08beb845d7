"""Stage: spectra in memory. The ``Spectrum`` record and its ion mode (``record``), cleaning steps and the
``CleaningPipeline`` (``cleaning``), fixed-length network inputs made from spectra (``features``).

May import: ``molpredict.errors``, ``molpredict.component``, ``molpredict.specs``. File formats are one stage up,
in :mod:`molpredict.io` (readers import the record from here, never the reverse).
"""
from __future__ import annotations

from molpredict.spectra.cleaning import (CleaningPipeline, count_empty, filter_ms_level, filter_relative_intensity,
                                         keep_top_peaks, merge_close_peaks, normalize_intensities,
                                         remove_precursor_peak, select_mz_range, transform_intensities)
from molpredict.spectra.record import ION_MODES, Spectrum, ion_mode_from, spectrum_ion_mode

__all__ = ["Spectrum", "ION_MODES", "ion_mode_from", "spectrum_ion_mode", "CleaningPipeline", "count_empty",
           "filter_ms_level", "filter_relative_intensity", "keep_top_peaks", "merge_close_peaks",
           "normalize_intensities", "remove_precursor_peak", "select_mz_range", "transform_intensities"]
