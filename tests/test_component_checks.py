"""What a kernel or sketch returns is checked where the package receives it: a wrong shape, a negative self-similarity,
an asymmetric or indefinite kernel matrix, a sketch draw outside its contract stop with one line naming the component
(a PluginError for a plugin's), never a silent broadcast, a garbage model or an internal error; and the conformance
helpers make their save/load round trip for a kernel that is not registered."""
from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from molpredict.engine.nystrom import Nystrom
from molpredict.engine.sketches import Sketch, SubsampleSketch
from molpredict.errors import PluginError
from molpredict.hookspecs import hookimpl
from molpredict.kernels.base import DegenerateObjectWarning, InputKernel
from molpredict.registry import Registry, reset_registry
from molpredict.testing import check_kernel, check_sketch

POINTS = [0.0, 0.3, 0.9, 1.4, 2.0, 2.2, 3.1, 4.0, 4.1, 5.5, 6.0, 7.2]


class _Vec(InputKernel):
    """A Gaussian kernel on numbers, with switches that break one contract each."""

    input_type = "vector"

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode

    def featurize(self, objects):
        f = np.asarray(objects, dtype=np.float64)
        return f[:-1] if self.mode == "featshort" else f

    def pairwise(self, fa, fb):
        d = fa[:, None] - fb[None, :]
        k = np.exp(-d * d)
        if self.mode == "col":
            return k[:, :1]
        if self.mode == "row":
            return k[:1, :]
        if self.mode == "scalar":
            return np.float64(k.mean())
        if self.mode == "transposed":
            return k.T
        if self.mode == "asym":
            return k * (1.0 + 0.1 * np.sign(d))
        if self.mode == "box":
            return np.where(np.abs(d) < 1.5, 1.0, 0.0)  # not PSD on POINTS (smallest eigenvalue -1.26)
        return k

    def self_similarity(self, features):
        if self.mode == "selfscalar":
            return 1.0
        if self.mode == "selfshort":
            return np.ones(len(features) - 1)
        if self.mode == "selfneg":
            return -np.ones(len(features))
        if self.mode == "selfzero":
            return np.zeros(len(features))
        if self.mode == "onezero":
            return (np.asarray(features) != 0.0).astype(np.float64)
        return np.ones(len(features))


class _ApproximatelyPSD(_Vec):
    psd = False


def _nystrom(kernel, m: int = len(POINTS)) -> Nystrom:
    return Nystrom(kernel, SubsampleSketch(m=m, seed=0)).fit(POINTS)


# -- kernel results ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode, shape", [("col", "(12, 1)"), ("row", "(1, 12)"), ("scalar", "()"),
                                         ("transposed", "(12, 5)")])
def test_a_kernel_block_of_the_wrong_shape_is_an_error_naming_the_kernel(mode, shape):
    """numpy broadcast a column, a row or a scalar into the block: every query got the same scores."""
    kernel = _Vec(mode).fit(POINTS)
    with pytest.raises(PluginError, match=rf"^kernel _Vec \(module .*\): pairwise returned an array of shape "
                                          rf"{re.escape(shape)} where \(\d+, 12\) was expected$"):
        kernel.transform(POINTS[:5]) if mode == "transposed" else kernel.gram()


@pytest.mark.parametrize("mode, message", [
    ("selfscalar", r"self_similarity returned an array of shape \(\) where \(12,\) was expected"),
    ("selfshort", r"self_similarity returned an array of shape \(11,\) where \(12,\) was expected"),
    ("selfneg", r"self_similarity returned 12 negative values \(min -1\); k\(x, x\) must be >= 0")])
def test_a_self_similarity_of_the_wrong_shape_or_negative_is_an_error(mode, message):
    """A negative self-similarity was taken for a degenerate object (kernel 0 with everything) without a word."""
    with pytest.raises(PluginError, match=message):
        _Vec(mode).fit(POINTS)


def test_featurize_giving_the_wrong_number_of_rows_is_an_error():
    with pytest.raises(PluginError, match=r"featurize returned 11 rows for 12 objects$"):
        _Vec("featshort").fit(POINTS)
    kernel = _Vec().fit(POINTS)
    kernel.mode = "featshort"
    with pytest.raises(PluginError, match=r"featurize returned 2 rows for 3 objects$"):
        kernel.transform(POINTS[:3])


def test_a_zero_self_similarity_stays_a_degenerate_object_warning():
    with pytest.warns(DegenerateObjectWarning, match="1 of 12 objects"):
        kernel = _Vec("onezero").fit(POINTS)  # POINTS[0] == 0.0
    assert kernel.gram()[0, 1] == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateObjectWarning)
        assert _nystrom(_Vec("onezero")).rank_ > 1


def test_a_kernel_degenerate_on_every_training_object_stops_training():
    """gram()'s unit diagonal made K = I: a model of nothing, trained with exit 0."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateObjectWarning)
        _Vec("selfzero").fit(POINTS)  # a sub-kernel of a combination may be so: not an error at fit
        with pytest.raises(PluginError, match=r"self_similarity is 0 for all 12 training objects"):
            _nystrom(_Vec("selfzero"))


# -- the sketched kernel matrix ---------------------------------------------------------------------------
def test_nystrom_refuses_an_asymmetric_kernel():
    """The eigensolver reads only the lower triangle: the upper one was silently ignored."""
    with pytest.raises(PluginError, match=r"^kernel _Vec \(module .*\): the sketched kernel matrix \(12 x 12\) is "
                                          r"not symmetric: max\|K - K\^T\| = 0\.\d+ max\|K\| \(tolerance 1e-05\)"):
        _nystrom(_Vec("asym"))


def test_nystrom_refuses_a_kernel_that_is_not_psd_unless_it_says_so():
    """The cut dropped the negative eigenvalues without a word; a kernel with psd = False keeps that."""
    with pytest.raises(PluginError, match=r"is not positive semi-definite: smallest eigenvalue -1\.26, largest "):
        _nystrom(_Vec("box"))
    features = _nystrom(_ApproximatelyPSD("box"))
    assert features.rank_ < len(POINTS) and np.all(features.eigenvalues_ > 0)


def test_the_matrix_checks_tolerate_round_off():
    import torch

    from molpredict.engine.nystrom import PSD_RTOL, SYMMETRY_RTOL, asymmetry_problem, spectrum_problem

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 300)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    K = (x.astype(np.float64) @ x.T.astype(np.float64))  # a cosine kernel, then float32 round-off on each entry
    # on its own (not mirrored), as when k(a, b) and k(b, a) come from different row blocks: some BLAS builds give
    # such blocks bit-identical products, others not, so the round-off is made here, not left to the library
    K = K + K * rng.uniform(-1, 1, size=K.shape) * np.finfo(np.float32).eps
    assert 1e-8 < np.abs(K - K.T).max() < 0.1 * SYMMETRY_RTOL
    assert asymmetry_problem(torch.from_numpy(K)) is None
    assert spectrum_problem(np.array([-0.1 * PSD_RTOL, 0.0, 1.0])) is None
    assert spectrum_problem(np.zeros(3)) is None  # the zero matrix: the caller's own error names it
    assert "not positive semi-definite" in spectrum_problem(np.array([-2.0 * PSD_RTOL, 1.0]))
    assert "not positive semi-definite" in spectrum_problem(np.array([-1.0, -0.5]))  # no positive eigenvalue
    K[0, 1] += 1e-3
    assert "not symmetric" in asymmetry_problem(torch.from_numpy(K))


def test_nystrom_gives_the_same_map_as_before_on_a_valid_kernel():
    """The checked decomposition cuts as truncated_eigh does."""
    from molpredict.engine.linalg import truncated_eigh

    features = Nystrom(_Vec(), SubsampleSketch(m=8, seed=0), rel_cutoff=1e-3).fit(POINTS)
    K = features.kernel_.gram() * (len(POINTS) / 8)
    s, _ = truncated_eigh(K, 1e-3)
    np.testing.assert_allclose(features.eigenvalues_, s, rtol=1e-12)


# -- sketch draws -----------------------------------------------------------------------------------------
class _Draw(Sketch):
    isometric = False

    def __init__(self, m: int = 4, seed: int | None = 0, mode: str = "ok") -> None:
        self.m = m
        self.seed = seed
        self.mode = mode

    def _draw(self, n, rng, kernel):
        m = int(self.m)
        used, A = np.arange(m), np.diag(np.arange(1.0, m + 1))
        if self.mode == "neg":
            used = used - m
        elif self.mode == "dup":
            used = np.zeros(m, dtype=np.int64)
        elif self.mode == "oob":
            used = used + n
        elif self.mode == "float":
            used = used + 0.7
        elif self.mode == "nan":
            A[0, 0] = np.nan
        elif self.mode == "shape":
            A = A[:, :-1]
        elif self.mode == "reversed":
            used, A = used[::-1].copy(), A[:, ::-1]
        return used, A


@pytest.mark.parametrize("mode, message", [
    ("neg", r"used indices out of \[0, 12\): min -4, max -1"),
    ("oob", r"used indices out of \[0, 12\): min 12, max 15"),
    ("dup", r"3 duplicate used indices"),
    ("float", r"used indices of shape \(4,\) and dtype float64, not a 1-D integer array"),
    ("nan", r"NaN or infinite weights in A"),
    ("shape", r"weights A of shape \(4, 3\) for 4 used indices")])
def test_a_sketch_draw_breaking_the_contract_is_an_error_naming_the_sketch(mode, message):
    """Negative or duplicate indices trained silently; out-of-range ones were an internal IndexError."""
    with pytest.raises(PluginError, match=rf"^sketch _Draw \(module .*\): _draw returned {message}"):
        _Draw(mode=mode).fit(12)


def test_a_sketch_draw_in_another_order_is_sorted_with_its_weights():
    ordered, reversed_ = _Draw().fit(12), _Draw(mode="reversed").fit(12)
    assert np.array_equal(reversed_.used_, np.arange(4))
    np.testing.assert_array_equal(reversed_.matrix(), ordered.matrix())


class _Plugin:
    __name__ = "checks-plugin"

    @hookimpl
    def register_input_kernels(self, register):
        register("checks-vec", _Vec)

    @hookimpl
    def register_sketches(self, register):
        register("checks-draw", _Draw)


def test_a_registered_component_is_named_by_its_registry_name_and_plugin():
    reset_registry(Registry(load_external=False, extra_plugins=[_Plugin()]))
    try:
        from molpredict.registry import create

        with pytest.raises(PluginError, match=r"^input kernel 'checks-vec' from plugin 'checks-plugin' \(_Vec\): "
                                              r"pairwise returned an array of shape \(12, 1\)"):
            create("input_kernel", "checks-vec:mode=col").fit(POINTS).gram()
        with pytest.raises(PluginError, match=r"^sketch 'checks-draw' from plugin 'checks-plugin' \(_Draw\): "):
            create("sketch", "checks-draw:mode=dup").fit(12)
    finally:
        reset_registry()


def test_a_builtin_kernel_breaking_its_contract_is_an_internal_error():
    """A built-in's bug is reported as a bug (the CLI's 'internal error ... report it'), not blamed on a plugin."""
    from molpredict.kernels.base import component_result_error
    from molpredict.registry import create

    error = component_result_error(create("input_kernel", "cosine"), "kernel", "pairwise returned NaN")
    assert type(error) is RuntimeError and str(error) == "input kernel 'cosine' (CosineKernel): pairwise returned NaN"


# -- the conformance helpers ------------------------------------------------------------------------------
class _Private(_Vec):
    """Fitted state in a private attribute: a model file does not keep it."""

    def _fit_data_dependent(self, features):
        self._width = 2.0

    def pairwise(self, fa, fb):
        d = (fa[:, None] - fb[None, :]) / self._width
        return np.exp(-d * d)


def test_check_kernel_makes_the_round_trip_for_an_unregistered_kernel():
    """The plugin guide calls check_kernel(MyKernel()): the round trip was skipped, and a kernel whose saved model
    fails on load passed; the rebuild's own error is a named check failure, not a traceback."""
    check_kernel(_Vec(), POINTS)
    with pytest.raises(AssertionError, match=r"^check_kernel\(_Private\): fitted state: the kernel rebuilt from its "
                                             r"fitted state raised AttributeError: .*_width"):
        check_kernel(_Private(), POINTS)


class _Unstored(_Draw):
    def __init__(self, m: int = 4, seed: int | None = 0, scale: float = 1.0) -> None:
        self.m, self.seed, self.mode = m, seed, "ok"
        self.factor = scale  # not stored under its own name: the sketch cannot be re-created from its parameters


def test_check_sketch_reports_a_bad_draw_and_a_failed_re_creation_as_named_checks():
    with pytest.raises(AssertionError, match=r"^_Draw: draw: sketch _Draw \(module .*\): _draw returned 3 duplicate"):
        check_sketch(_Draw(mode="dup"), n=12)
    with pytest.raises(AssertionError, match=r"^_Unstored: re-creation: .*AttributeError"):
        check_sketch(_Unstored(), n=12)
