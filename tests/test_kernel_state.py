"""Fitted kernels saved as their features (Kernel.get_fitted_state / from_fitted_state): what a model file stores so
that loading re-featurises nothing. Every built-in kernel's exact round trip is in the conformance suite (step 9 of
molpredict.testing.check_kernel); here: the combination kernel's sharing and its rebuild in a fresh process, and the
kernels that cannot be saved so."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from molpredict.kernels.base import Kernel, StateNotSaveable, decode_fitted, encode_fitted
from molpredict.chem.molecules import Molecule
from molpredict.registry import get_registry
from test_conformance import CONFORMANCE_SMILES, conformance_spectra
from conftest import child_pythonpath

ROOT = Path(__file__).resolve().parents[1]
MKL = "mkl:kernels=ppk-losses+formula-annotation+cosine,weights=uniform"


def test_mkl_state_stores_its_sub_kernels_features_once():
    spectra = conformance_spectra()
    kernel = get_registry().create("input_kernel", MKL).fit(spectra[:20])
    arrays, meta = kernel.get_fitted_state("k")
    # the combination's features are its sub-kernels' features: written under the sub-kernels, referenced once more
    assert list(meta["attributes"])[0] == "subkernels_"
    parts = meta["attributes"]["fit_features_"]["fields"]["parts"]["list"]
    assert all(set(p) == {"ref"} for p in parts)
    assert not any(name.startswith("k.fit_features_") for name in arrays)
    rebuilt = Kernel.from_fitted_state(arrays, json.loads(json.dumps(meta)))
    assert all(a is b for a, b in zip(rebuilt.fit_features_.parts, [k.fit_features_ for k in rebuilt.subkernels_]))
    np.testing.assert_array_equal(rebuilt.transform(spectra[20:]), kernel.transform(spectra[20:]))


def test_mkl_state_rebuilds_in_a_fresh_process(tmp_path):
    """Only the mkl module is imported when its state is read: rebuilding the sub-kernels first imports theirs
    (and registers their features classes) before the combination's features are read."""
    spectra = conformance_spectra()
    kernel = get_registry().create("input_kernel", MKL).fit(spectra[:20])
    arrays, meta = kernel.get_fitted_state("k")
    np.savez(tmp_path / "state.npz", **arrays)
    (tmp_path / "state.json").write_text(json.dumps(meta))
    np.save(tmp_path / "expected.npy", kernel.gram())
    code = (f"import json, sys, numpy as np\n"
            f"from molpredict.kernels.base import Kernel\n"
            f"assert 'molpredict.kernels.spectra' not in sys.modules\n"
            f"arrays = dict(np.load({str(tmp_path / 'state.npz')!r}))\n"
            f"kernel = Kernel.from_fitted_state(arrays, json.loads(open({str(tmp_path / 'state.json')!r}).read()))\n"
            f"assert np.array_equal(kernel.gram(), np.load({str(tmp_path / 'expected.npy')!r}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": child_pythonpath(ROOT), "PATH": "/usr/bin:/bin", "MOLPREDICT_LOAD_PLUGINS": ""})
    assert done.returncode == 0, done.stderr


def test_graph_kernels_are_not_saveable_and_say_so():
    molecules = [Molecule.from_smiles(s) for s in CONFORMANCE_SMILES[:6]]
    kernel = get_registry().create("output_kernel", "wl-subtree").fit(molecules)
    with pytest.raises(StateNotSaveable):
        kernel.get_fitted_state("k")


def test_encode_refuses_objects_and_decode_unknown_classes():
    with pytest.raises(StateNotSaveable, match="object array"):
        encode_fitted(np.array(["a", None], dtype=object), "x", {}, {})
    with pytest.raises(StateNotSaveable, match="cannot save a set"):
        encode_fitted({1, 2}, "x", {}, {})
    with pytest.raises(StateNotSaveable, match="unknown features class"):
        decode_fitted({"type": "NotAFeaturesClass", "fields": {}, "at": "x"}, {}, {})
    with pytest.raises(StateNotSaveable, match="incomplete"):
        decode_fitted({"array": "missing"}, {}, {})
    arrays: dict = {}
    value = {"a": [1, 2.5, None, "s", True], "b": (np.arange(3), np.arange(3))}
    meta = json.loads(json.dumps(encode_fitted(value, "v", arrays, {})))
    back = decode_fitted(meta, arrays, {})
    assert back["a"] == [1, 2.5, None, "s", True] and isinstance(back["b"], tuple)
    assert all(np.array_equal(x, np.arange(3)) for x in back["b"])
