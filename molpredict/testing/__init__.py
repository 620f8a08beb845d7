"""Conformance checks that plugin authors can run on their own kernels and sketches.

>>> from molpredict.testing import check_kernel, check_sketch
"""
from .kernels import check_kernel
from .sketches import check_sketch

__all__ = ["check_kernel", "check_sketch"]
