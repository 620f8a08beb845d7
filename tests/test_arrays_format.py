"""Spectra arrays in bundles keep the format name they were saved with before the layout move."""
from __future__ import annotations

import numpy as np
import pytest

from molpredict.errors import ModelFileError
from molpredict.io.arrays import spectra_from_arrays, spectra_to_arrays
from molpredict.spectra.record import Spectrum


def test_spectra_arrays_format_name_is_stable_and_both_names_read():
    spectra = [Spectrum(id="a", mz=np.array([50.0, 80.5]), intensities=np.array([1.0, 0.3]), precursor_mz=120.0)]
    arrays, meta = spectra_to_arrays(spectra)
    assert meta["format"] == "molpredict.spectra"  # what bundles saved before the layout move hold
    for name in ("molpredict.spectra", "molpredict.spectra.cleaning"):
        again = spectra_from_arrays(arrays, {**meta, "format": name})
        np.testing.assert_array_equal(again[0].mz, spectra[0].mz)
    with pytest.raises(ModelFileError):
        spectra_from_arrays(arrays, {**meta, "format": "something.else"})
