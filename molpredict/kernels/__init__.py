"""Kernels on inputs (spectra, strings) and outputs (molecules): the ``Kernel`` ABC and one module per family."""
from molpredict.kernels.base import InputKernel, Kernel, OutputKernel

__all__ = ["Kernel", "InputKernel", "OutputKernel"]
