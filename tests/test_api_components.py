"""``molpredict.train`` given a kernel or sketch as an object: an instance (or class) of a registered component is
trained as its registry spec, anything else is refused in one line saying to pass the registered name or spec
string (it was refused as an "unknown input kernel 'CosineKernel(tolerance=...)'")."""
from __future__ import annotations

import pytest

import molpredict
from identification_helpers import synthetic_spectra
from molpredict.engine.sketches import SubsampleSketch
from molpredict.errors import SpecError
from molpredict.io import write_mgf
from molpredict.kernels.fingerprints import TanimotoKernel
from molpredict.kernels.spectra import CosineKernel
from molpredict.registry import create

OPTIONS = dict(lam=0.1, device="cpu", fragments=False, prior="none", output_sketch="subsample:m=8")


@pytest.fixture
def train_file(tmp_path):
    spectra, _ = synthetic_spectra(n_per=2, seed=0)
    write_mgf(spectra, tmp_path / "train.mgf")
    return tmp_path / "train.mgf"


def test_a_registered_kernel_and_sketch_given_as_objects_are_trained_as_their_specs(train_file):
    kernel = create("input_kernel", "cosine:tolerance=0.02,intensity_power=1.0")
    bundle = molpredict.train(train_file, input_kernel=kernel, output_kernel=TanimotoKernel,
                              input_sketch=SubsampleSketch(m=8, seed=3), **OPTIONS)
    model = bundle.for_mode(bundle.ion_modes[0]).model
    assert model.input_kernel == "cosine:tolerance=0.02,matching=binned,intensity_power=1.0"
    assert model.output_kernel == "tanimoto"
    assert model.input_sketch == "subsample:m=8,probs=uniform,leverage_lam=0.001,seed=3"
    assert kernel.get_params()["tolerance"] == 0.02 and not hasattr(kernel, "fit_features_")  # used, not fitted


class _Unregistered(CosineKernel):
    """A subclass of a registered kernel: not registered itself (its registry name is its parent's)."""


def _cosine(**attributes):
    """A cosine kernel whose attributes were set after it was built (what its spec could not carry)."""
    kernel = CosineKernel()
    vars(kernel).update(attributes)
    return kernel


@pytest.mark.parametrize("option, value, message", [
    ("input_kernel", _Unregistered(), r"^input_kernel: _Unregistered is not a registered input kernel; pass its "
                                      r"registered name or spec string instead \(input_kernel='NAME:key=value,...'"),
    ("output_kernel", CosineKernel(), r"^output_kernel: CosineKernel is not a registered output kernel; "),
    ("input_sketch", TanimotoKernel(), r"^input_sketch: TanimotoKernel is not a registered sketch; "),
    ("input_kernel", _cosine(tolerance=[0.01, 0.02]),
     r"^input_kernel: the parameters of this 'cosine' input kernel \(CosineKernel\) cannot be written as a spec; "
     r"pass its registered name or spec string instead"),
    ("input_kernel", _cosine(matching="binned,tolerance=1"),
     r"^input_kernel: the parameters of this 'cosine' input kernel \(CosineKernel\) cannot be written as a spec")])
def test_a_component_object_that_is_not_a_registered_spec_is_refused_in_one_line(train_file, option, value, message):
    with pytest.raises(SpecError, match=message) as refused:
        molpredict.train(train_file, **{**OPTIONS, option: value})
    assert refused.value.exit_code == 2 and "\n" not in str(refused.value)
