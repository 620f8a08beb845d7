"""Kernel values that the linear algebra cannot use (finite but huge, a failing eigensolver) and an ``mkl`` sub-kernel
breaking its result contract stop with one line naming the kernel (a PluginError, exit 3, for a plugin's), never a
LinAlgError from the eigensolver or a sum silently broadcast from a column."""
from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner

from molpredict.cli import cli
from molpredict.engine.nystrom import Nystrom
from molpredict.engine.sketches import SubsampleSketch
from molpredict.errors import PluginError
from molpredict.hookspecs import hookimpl
from molpredict.kernels.base import MAX_KERNEL_VALUE, InputKernel
from molpredict.registry import Registry, create, reset_registry

POINTS = [0.0, 0.3, 0.9, 1.4, 2.0, 2.2, 3.1, 4.0, 4.1, 5.5, 6.0, 7.2]


class _Scaled(InputKernel):
    """``scale`` times a Gaussian kernel on numbers, used as it is (not normalised); ``mode`` breaks a contract."""

    input_type = "vector"
    normalized = False

    def __init__(self, scale: float = 1.0, mode: str = "ok") -> None:
        self.scale = scale
        self.mode = mode

    def featurize(self, objects):
        return np.asarray(objects, dtype=np.float64)

    def pairwise(self, fa, fb):
        d = fa[:, None] - fb[None, :]
        k = self.scale * np.exp(-d * d)
        if self.mode == "col":
            return k[:, :1]
        if self.mode == "row":
            return k[:1, :]
        if self.mode == "huge-pairs":
            return 1e300 * k
        return k

    def self_similarity(self, features):
        return np.full(len(features), float(self.scale))


class _UnitDiagonal(_Scaled):
    """Unit diagonal declared (so the kernel's own check leaves its values to the Nystrom map's), and only
    approximately PSD (so no PSD check stops it first)."""

    unit_diagonal = True
    psd = False


class _Normalised(_Scaled):
    """Huge raw values that the cosine normalisation divides back to the Gaussian kernel."""

    normalized = True


def _nystrom(kernel, **fit) -> Nystrom:
    return Nystrom(kernel, SubsampleSketch(m=len(POINTS), seed=0)).fit(POINTS, **fit)


# -- finite but huge values -------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [1e300, 1e200, 1e151])
def test_a_kernel_with_huge_values_is_an_error_naming_it(scale):
    """1e300 passed the finiteness check and training died in the eigensolver (LinAlgError, naming nothing)."""
    with pytest.raises(PluginError, match=rf"^kernel _Scaled \(module .*\): self_similarity returned values up to "
                                          rf"{re.escape(f'{scale:.3g}')} in magnitude \(more than 1e\+150"):
        _nystrom(_Scaled(scale))
    with pytest.raises(PluginError, match=r"^kernel _Scaled \(module .*\): pairwise returned values up to 1e\+300 in "
                                          r"magnitude"):
        _Scaled(mode="huge-pairs").fit(POINTS).transform(POINTS[:3])


def test_values_up_to_the_limit_and_huge_raw_values_of_a_normalised_kernel_are_used():
    """The limit is on the values the linear algebra uses: normalisation divides a raw 1e300 back to 1."""
    assert _nystrom(_Scaled(MAX_KERNEL_VALUE)).rank_ == len(POINTS)
    reference = _nystrom(_Scaled(1.0))
    huge = _nystrom(_Normalised(1e300))
    np.testing.assert_allclose(huge.eigenvalues_, reference.eigenvalues_, rtol=1e-10)


def test_the_sketched_matrix_is_checked_when_the_kernel_does_not_check_its_values():
    with pytest.raises(PluginError, match=r"^kernel _UnitDiagonal \(module .*\): the sketched kernel matrix "
                                          r"\(12 x 12\) has values up to 9.9e\+299 in magnitude"):
        _nystrom(_UnitDiagonal(1e300))


def test_sketched_rows_too_large_for_float32_are_an_error():
    """Cast to float32 (a GPU fit), 1e20 became inf in the features without a word."""
    import torch

    assert _nystrom(_Scaled(1e20)).rank_ == len(POINTS)  # float64: fine
    with pytest.raises(PluginError, match=r"the sketched kernel rows \(12 x 12\) in torch.float32 has values up to "
                                          r"1e\+20 in magnitude \(more than 1e\+15"):
        _nystrom(_Scaled(1e20), dtype=torch.float32)


def test_a_failing_eigendecomposition_is_an_error_naming_the_kernel(monkeypatch):
    import molpredict.engine.nystrom as nystrom

    def fails(matrix):
        raise np.linalg.LinAlgError("the algorithm failed to compute an eigenvalue")

    monkeypatch.setattr(nystrom, "symmetric_eigh", fails)
    with pytest.raises(PluginError, match=r"^kernel _Scaled \(module .*\): the eigendecomposition of the sketched "
                                          r"kernel matrix \(12 x 12\) failed \(LinAlgError: the algorithm failed"):
        _nystrom(_Scaled(1.0))


_HUGE_PLUGIN = '''
import numpy as np
from molpredict.hookspecs import hookimpl
from molpredict.kernels import InputKernel

class HugeKernel(InputKernel):
    normalized = False

    def __init__(self, scale: float = 1e300) -> None:
        self.scale = scale

    def featurize(self, spectra):
        return np.array([[float(s.n_peaks), float(s.precursor_mz or 0.0)] for s in spectra])

    def pairwise(self, fa, fb):
        d = ((fa[:, None, :] - fb[None, :, :]) ** 2).sum(-1)
        return self.scale * np.exp(-d / 1e4)

    def self_similarity(self, f):
        return np.full(len(f), self.scale)

@hookimpl
def register_input_kernels(register):
    register("huge", HugeKernel)
'''


def test_training_with_a_plugin_kernel_of_huge_values_exits_3_naming_it(tmp_path, monkeypatch):
    """The command ended with 'internal error: LinAlgError ... (a bug: report it)', exit 1."""
    from identification_helpers import synthetic_spectra
    from molpredict.io import write_mgf
    from plugin_helpers import use_plugins_dir

    use_plugins_dir(tmp_path, monkeypatch, {"huge.py": _HUGE_PLUGIN})
    spectra, _ = synthetic_spectra(n_per=2, seed=0)
    write_mgf(spectra, tmp_path / "train.mgf")
    result = CliRunner().invoke(cli, ["train", str(tmp_path / "train.mgf"), "-o", str(tmp_path / "m"),
                                      "--input-kernel", "huge:scale=1e300", "--lam", "0.1", "--device", "cpu",
                                      "--no-fragments", "--prior", "none", "--input-sketch", "subsample:m=8",
                                      "--output-sketch", "subsample:m=8"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 3 and "Traceback" not in result.output, result.output
    assert lines[-1].startswith("molpredict: error: input kernel 'huge' from plugin 'huge' (HugeKernel): "
                                "self_similarity returned values up to 1e+300 in magnitude"), lines[-1]
    assert "LinAlgError" not in result.output and "internal error" not in result.output


# -- mkl: each sub-kernel's results are checked -----------------------------------------------------------
class _Plugin:
    __name__ = "results-plugin"

    @hookimpl
    def register_input_kernels(self, register):
        register("results-scaled", _Scaled)


@pytest.fixture
def registered():
    reset_registry(Registry(load_external=False, extra_plugins=[_Plugin()]))
    yield
    reset_registry()


@pytest.mark.parametrize("mode, shape", [("col", "(12, 1)"), ("row", "(1, 12)")])
def test_an_mkl_sub_kernel_block_of_the_wrong_shape_is_an_error_naming_it(registered, mode, shape):
    """mkl sums its sub-kernels' blocks itself: a column was broadcast into the sum, every row the same."""
    kernel = create("input_kernel", f"mkl:kernels=results-scaled+results-scaled:mode={mode}").fit(POINTS)
    with pytest.raises(PluginError, match=rf"^input kernel 'results-scaled' from plugin 'results-plugin' \(_Scaled\): "
                                          rf"pairwise returned an array of shape {re.escape(shape)} where \(12, 12\) "
                                          rf"was expected$"):
        kernel.gram()


def test_an_mkl_sub_kernel_is_checked_on_new_objects_too(registered):
    kernel = create("input_kernel", "mkl:kernels=results-scaled+results-scaled").fit(POINTS)
    expected = kernel.transform(POINTS[:3])
    assert expected.shape == (3, 12) and np.all(np.isfinite(expected))
    kernel.subkernels_[1].scale = 1e300  # its self-similarity, read when mkl featurises the new objects
    with pytest.raises(PluginError, match=r"^input kernel 'results-scaled' from plugin 'results-plugin' \(_Scaled\): "
                                          r"self_similarity returned values up to 1e\+300 in magnitude"):
        kernel.transform(POINTS[:3])
    kernel.subkernels_[1].scale, kernel.subkernels_[1].mode = 1.0, "row"
    with pytest.raises(PluginError, match=r"pairwise returned an array of shape \(1, 12\) where \(3, 12\)"):
        kernel.transform(POINTS[:3])
