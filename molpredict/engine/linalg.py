"""Dense linear algebra shared by the models: the one truncated eigendecomposition (every pseudo-inverse and
whitening of the package goes through it) and the symmetric eigensolver under it."""
from __future__ import annotations

import os

import numpy as np

from molpredict.lazy import lazy_module

torch = lazy_module("torch")  # fitting and GPU paths only: not imported to predict

__all__ = ["truncated_eigh", "cut_eigenpairs", "symmetric_eigh"]


def _cores_free() -> bool:
    """Whether this machine's cores are free for one more thread: the 1-minute load average (this process's
    own busy thread included) is at least half a core below the core count."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not on a Unix
        return False
    return load < (os.cpu_count() or 1) - 0.5


def symmetric_eigh(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """All eigenpairs of a symmetric matrix (lower triangle read), ascending, on the matrix's device and dtype.

    On the CPU this is LAPACK's divide-and-conquer solver (``syevd``) through SciPy: at order 4000 on 2 cores it
    took 9 s on one thread where torch's CPU ``eigh`` took 14.5 s. It runs on all of NumPy's BLAS threads only
    when the cores are free (:func:`_cores_free`; 5.2 s on 2 idle cores): multi-threaded eigensolvers synchronise
    their threads many times and slow down several-fold as soon as another process takes a core (torch's took
    81 s on 2 threads beside one busy process, SciPy's 12 to 36 s). On a GPU it is torch's.

    Parameters
    ----------
    matrix : Tensor of shape (k, k)

    Returns
    -------
    s : Tensor of shape (k,)
    V : Tensor of shape (k, k)
    """
    if matrix.device.type != "cpu":
        return torch.linalg.eigh(matrix)
    import scipy.linalg
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=None if _cores_free() else 1, user_api="blas"):
        s, V = scipy.linalg.eigh(matrix.numpy(), lower=True, driver="evd", check_finite=False)
    return torch.from_numpy(s), torch.from_numpy(V)


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
    s, V = cut_eigenpairs(*symmetric_eigh(tensor), rtol)
    return (s.numpy(), V.numpy()) if as_numpy else (s, V)


def cut_eigenpairs(s: "torch.Tensor", V: "torch.Tensor", rtol: float) -> "tuple[torch.Tensor, torch.Tensor]":
    """:func:`truncated_eigh`'s cut of a whole ascending decomposition ``(s, V)`` (for callers that read the
    whole spectrum first, e.g. to check that it is PSD): the pairs above ``rtol * largest``, largest first."""
    top = float(s[-1]) if s.numel() else 0.0
    if top > 0:
        first = int(torch.searchsorted(s, torch.tensor(rtol * top, dtype=s.dtype, device=s.device), right=True))
    else:
        first = int(s.shape[0])
    return s[first:].flip(0), V[:, first:].flip(1)
