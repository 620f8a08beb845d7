"""Conformance checks that plugin authors can run on their own kernels, sketches and models.

>>> from molpredict.testing import check_kernel, check_model, check_sketch
"""
from .kernels import check_kernel
from .models import check_model
from .sketches import check_sketch

__all__ = ["check_kernel", "check_model", "check_sketch"]
