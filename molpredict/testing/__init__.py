"""Conformance checks that plugin authors can run on their own kernels, sketches, models and
regressors.

>>> from molpredict.testing import check_kernel, check_model, check_regressor, check_sketch
"""
from molpredict.testing.kernels import check_kernel
from molpredict.testing.models import check_model
from molpredict.testing.regressors import check_regressor
from molpredict.testing.sketches import check_sketch

__all__ = ["check_kernel", "check_model", "check_regressor", "check_sketch"]
