"""Kernels on inputs (spectra, strings) and outputs (molecules): the ``Kernel`` ABC and one module per family."""
from .base import InputKernel, Kernel, OutputKernel

__all__ = ["Kernel", "InputKernel", "OutputKernel"]
