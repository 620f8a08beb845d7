"""Dense linear algebra shared by the models: the one truncated eigendecomposition (every pseudo-inverse and
whitening of the package goes through it) and the CPU thread policy of the eigensolver."""
from __future__ import annotations

import contextlib

import numpy as np

from molpredict.lazy import lazy_module

torch = lazy_module("torch")  # fitting and GPU paths only: not imported to predict

__all__ = ["truncated_eigh", "lapack_threads"]


#: below this order a CPU eigendecomposition runs on one thread (see lapack_threads)
_SERIAL_EIGH_MAX = 4096


@contextlib.contextmanager
def lapack_threads(matrix: torch.Tensor):
    """Run a CPU eigensolver of order <= _SERIAL_EIGH_MAX on one thread.

    The multi-threaded tridiagonal eigensolver synchronises its threads many times; below a few thousand rows it
    gains little, and when the cores are shared it becomes 5 to 50 times slower than one thread (measured on
    2 shared cores: order 2000 took 21 s on 2 threads, 4 s on 1).
    """
    if matrix.device.type != "cpu" or matrix.shape[0] > _SERIAL_EIGH_MAX or torch.get_num_threads() == 1:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def truncated_eigh(matrix: "np.ndarray | torch.Tensor", rtol: float = 1e-10
                   ) -> "tuple[np.ndarray, np.ndarray] | tuple[torch.Tensor, torch.Tensor]":
    """Eigenpairs of a symmetric PSD matrix above a relative cut-off, in float64, largest first.

    The one eigen cut-off of the package: ``M^+ = V diag(1/s) V^T`` and ``M^+1/2 = V diag(s^-1/2)`` on the kept
    pairs. Only the lower triangle is read (no symmetrised copy of a large matrix is made); duplicates in a sketch
    make the matrix singular, and this is where that is handled.

    Parameters
    ----------
    matrix : ndarray or Tensor of shape (k, k)
    rtol : float
        Eigenvalues ``<= rtol * largest`` (and all of them when the largest is not positive) are dropped.

    Returns
    -------
    s : ndarray or Tensor of shape (r,), float64, descending
    V : ndarray or Tensor of shape (k, r), float64 (numpy in, numpy out; a tensor stays on its device)
    """
    as_numpy = not isinstance(matrix, torch.Tensor)
    tensor = torch.from_numpy(np.asarray(matrix, dtype=np.float64)) if as_numpy else matrix.to(torch.float64)
    with lapack_threads(tensor):
        s, V = torch.linalg.eigh(tensor)
    top = float(s[-1]) if s.numel() else 0.0
    if top > 0:
        first = int(torch.searchsorted(s, torch.tensor(rtol * top, dtype=s.dtype, device=s.device), right=True))
    else:
        first = int(s.shape[0])
    s, V = s[first:].flip(0), V[:, first:].flip(1)
    return (s.numpy(), V.numpy()) if as_numpy else (s, V)
