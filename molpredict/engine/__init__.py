"""Stage: the numerical engine. Sketch matrices (``sketches``), the one eigenvalue cut-off (``linalg``), Nystrom
feature maps (``nystrom``), the CPU/CUDA and float-type decision (``device``), DSOKR's neural input encoders
(``encoders``) and the choice of the output sketch size (``sketch_size``).

May import: the core modules, :mod:`molpredict.spectra`, :mod:`molpredict.chem`, :mod:`molpredict.io` and
:mod:`molpredict.kernels` (encoders and Nystrom maps use registered kernels).
"""
