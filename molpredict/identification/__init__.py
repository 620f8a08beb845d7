"""Stage: identification, where a query is scored. Where candidates come from (``candidate_sources``), the
candidate-coordinates store (``coordinates_cache``), blocked scoring and executors (``scoring``), the terms beside
the model and their fusion (``evidence``, ``fusion``), the calibrated probability (``calibration``), ranking and
metrics (``decoding``), the pipeline of ``molpredict identify`` (``identify``) and of ``evaluate`` (``evaluate``).

May import: everything below it (core, spectra, chem, io, engine, kernels, models, modelfile); never training,
report, data or cli.
"""
