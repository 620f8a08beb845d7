"""Stage: properties of unknown molecules. RDKit property targets of training structures (``targets``), the
per-ion-mode quantile predictor with conformal intervals and its bundle (``model``), the metrics (``metrics``)
and the train / predict / evaluate pipeline (``pipeline``), with :func:`predict_properties` for scripts.

May import: the core modules, :mod:`molpredict.spectra`, :mod:`molpredict.chem`, :mod:`molpredict.io`,
:mod:`molpredict.kernels`, :mod:`molpredict.engine` and :mod:`molpredict.models` (the registered regressors).
"""
from __future__ import annotations

import os
from typing import Any

__all__ = ["predict_properties"]


def predict_properties(spectra: Any, model: Any, *, skipped: list | None = None) -> "Any":
    """Properties of the molecules behind spectra: per spectrum and property the median and an interval.

    Parameters
    ----------
    spectra : str, path or sequence of Spectrum
        A spectra file (MGF, MSP, mzML, mzXML, optionally gzipped) or ``Spectrum`` records.
    model : str, path or PropertyBundle
        A property model written by ``molpredict properties train`` (or :meth:`PropertyBundle.save`).
    skipped : list, optional
        If given, receives a :class:`~molpredict.properties.pipeline.Skipped` (file, record, reason) for each
        record that could not be predicted (unreadable, an ion mode the model lacks).

    Returns
    -------
    pandas.DataFrame
        One row per predicted spectrum, in input order: ``id``, ``file``, ``record``, ``ion_mode``, then per
        property (``logp``, ``tpsa``, ``mw``, ``hbd``, ``hba``, ``rotatable_bonds``, ``rings``,
        ``aromatic_rings``, ``fraction_sp3``, ``qed``) its median ``<name>`` and interval ``<name>_low``,
        ``<name>_high`` (the outermost trained levels, 0.1 and 0.9 by default, calibrated on validation spectra
        to cover 80% of new structures).

    Raises
    ------
    ModelFileError
        ``model`` is not a property model.
    InputError
        The spectra file cannot be read.

    Examples
    --------
    >>> table = predict_properties("unknowns.mgf", "props-model")  # doctest: +SKIP
    >>> table[["id", "logp", "logp_low", "logp_high"]].head()  # doctest: +SKIP
    """
    from molpredict.properties.model import PropertyBundle
    from molpredict.properties.pipeline import predict_table

    bundle = model if isinstance(model, PropertyBundle) else PropertyBundle.load(os.fspath(model))
    table, left_out = predict_table(spectra, bundle)
    if skipped is not None:
        skipped.extend(left_out)
    return table
