"""Conformance checks that plugin authors can run on their own kernels, sketches and models.

>>> from molpredict.testing import check_kernel, check_model, check_sketch
"""
from molpredict.testing.kernels import check_kernel
from molpredict.testing.models import check_model
from molpredict.testing.sketches import check_sketch

__all__ = ["check_kernel", "check_model", "check_sketch"]
