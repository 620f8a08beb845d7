"""Stage: chemistry. Molecules and fingerprints (``molecules``), molecular and ion formulas and sub-formula search
(``formulas``), in-silico fragmentation and peak explanation (``fragments``), candidate libraries and
candidate-set files (``candidates``).

May import: the core modules (``errors``, ``specs``, ``component``, ``cache``, ``config``) and
:mod:`molpredict.spectra`, :mod:`molpredict.io`.
"""
