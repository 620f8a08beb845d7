"""``benchmarks/dsokr.py``: its pure helpers (QM9 molecules, GED, the random row, sizes) and a ``qm9 --quick`` run."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import load_benchmark, require_shared
from molpredict.chem.molecules import Molecule


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("dsokr")


def test_qm9_molecules_are_kekulised_and_one_atom_ones_dropped(bench):
    assert bench.qm9_molecule("C") is None and bench.qm9_molecule("[NH4+]") is None
    assert bench.qm9_molecule("not a smiles") is None
    text, molecule = bench.qm9_molecule("c1ccoc1")
    assert text == "c1ccoc1"  # the input stays RDKit's canonical (aromatic) SMILES
    edges, labels, bonds = molecule.graph(bond_labels=True)
    assert sorted(set(bonds.values())) == ["DOUBLE", "SINGLE"]  # no AROMATIC bond in the output graph
    assert sorted(labels.values()) == ["C", "C", "C", "C", "O"]
    assert molecule.inchikey14 == Molecule.from_smiles("c1ccoc1").inchikey14


def test_graph_edit_distances_with_and_without_bond_labels(bench):
    propene, propane = bench.qm9_molecule("C=CC")[1], bench.qm9_molecule("CCC")[1]
    ethanol = bench.qm9_molecule("CCO")[1]
    memo: dict = {}
    got = bench.graph_edit_distances([(propene, propane), (propane, propane), (propane, ethanol)], 5.0, 1, memo)
    assert [d for d, _ in got[False]] == [0.0, 0.0, 1.0]  # same skeleton; identical; one relabelled atom
    assert [d for d, _ in got[True]] == [1.0, 0.0, 1.0]   # the double bond counts once bonds are labelled
    assert not any(t for _, t in got[False] + got[True])
    assert (propene.smiles, propane.smiles, True) in memo
    memo[(propene.smiles, propane.smiles, True)] = (7.0, True)  # a second call reads the memo
    assert bench.graph_edit_distances([(propene, propane)], 5.0, 1, memo)[True] == [(7.0, True)]


def test_random_row_is_the_exact_expectation(bench):
    a, b, c = (Molecule.from_smiles(s) for s in ("CCO", "CCN", "CCC"))
    # query 1: 2 candidates with the truth; query 2: 3 candidates; query 3: the truth is not a candidate
    row = bench.random_row([a, b, c], [[a, b], [a, b, c], [a, b]])["test"]
    assert row["hit@1"] == pytest.approx((1 / 2 + 1 / 3 + 0) / 3)
    assert row["hit@5"] == pytest.approx(2 / 3)
    assert row["mrr"] == pytest.approx(((1 + 1 / 2) / 2 + (1 + 1 / 2 + 1 / 3) / 3) / 3)
    assert row["mean_rank"] == pytest.approx((1.5 + 2.0 + 3.0) / 3)


def test_sizes_quick_task_defaults_and_rows(bench):
    full = bench.parse_args(["chebi", "--data", "data-dir"])
    assert (full.m_y, full.m_x, full.epochs) == (2000, 2000, 30)
    quick = bench.parse_args(["qm9", "--data", "data-dir", "--quick", "--m-y", "50"])
    assert (quick.m_y, quick.n_train, quick.n_val) == (50, 400, 100)
    qm9 = bench.parse_args(["qm9", "--data", "data-dir"])
    assert (qm9.n_train, qm9.n_val, qm9.n_test, qm9.n_ged) == (20000, 500, 2000, 200)
    names = [r.name for r in bench.chebi_rows(full)]
    assert len(names) == len(set(names)) == 10 and full.batch_size == 64
    assert "dsokr-ensemble3/kernel-mlp(text-ngram)/fingerprint-cosine" in names
    assert "embedding-regression (IOKR, linear kernels)" in names
    massbank = bench.parse_args(["massbank", "--data", "data-dir", "--members", "1,3"])
    assert (massbank.m_y, massbank.m_x) == (2000, 4000)
    rows = bench.massbank_rows(massbank)
    assert [r.name for r in rows] == ["dsokr", "dsokr-binned-mlp", "sisokr", "prior", "dsokr-ensemble3"]
    assert rows[-1].params["n_members"] == 3
    encoder = "kernel-mlp:layers=0;whiten=true;n_landmarks=4000"
    assert rows[0].params["encoder"] == rows[-1].params["encoder"] == encoder
    assert rows[1].params["encoder"] == "mlp"
    given = bench.massbank_rows(bench.parse_args(["massbank", "--data", "data-dir", "--members", "1",
                                                  "--encoder", "mlp:layers=1"]))
    assert [r.name for r in given] == ["dsokr", "sisokr", "prior"]  # no second DSOKR row beside a given encoder
    same = bench.massbank_rows(bench.parse_args(["massbank", "--data", "data-dir", "--members", "1,3",
                                                 "--input-kernel", "mkl", "--output-kernel", "tanimoto"]))
    assert [r.name for r in same] == ["dsokr", "sisokr", "prior", "dsokr-ensemble3"]  # no binned MLP beside it
    assert same[0].params["encoder"] == "kernel-mlp:input_kernel=mkl;layers=0;whiten=true;n_landmarks=4000"
    assert same[0].params["output_kernel"] == same[-1].params["output_kernel"] == "tanimoto"
    with pytest.raises(SystemExit, match="cannot carry"):
        bench.massbank_rows(bench.parse_args(["massbank", "--data", "data-dir", "--input-kernel",
                                              "mkl:kernels=ppk-losses,weights=uniform"]))
    # SISOKR rows per ranking fine-tune budget and learning rate: 0 is the ridge solution (no learning rate)
    ranked = bench.massbank_rows(bench.parse_args(["massbank", "--data", "data-dir", "--members", "1", "--encoder",
                                                   "mlp", "--rank-epochs", "0,3", "--rank-lr", "1e-4,3e-4"]))
    sisokr = {r.name: r.params for r in ranked if r.model == "sisokr"}
    assert list(sisokr) == ["sisokr-ridge", "sisokr-rank3-lr0.0001", "sisokr"]
    assert sisokr["sisokr-ridge"]["rank_epochs"] == 0 and "rank_lr" not in sisokr["sisokr-ridge"]
    assert (sisokr["sisokr-rank3-lr0.0001"]["rank_lr"], sisokr["sisokr"]["rank_lr"]) == (1e-4, 3e-4)
    kernels = bench.parse_args(["qm9", "--data", "data-dir", "--output-kernels", "nspd,core-wl"])
    assert [r.name for r in bench.qm9_rows(kernels)] == ["dsokr/transformer/nspd", "sisokr/smiles-ngram/nspd",
                                                        "dsokr/transformer/core-wl", "sisokr/smiles-ngram/core-wl"]


@pytest.mark.shared
def test_qm9_quick_run(bench, tmp_path):
    data = require_shared("qm9", "qm9.smi").parents[1]
    bench.main(["qm9", "--quick", "--out", str(tmp_path), "--data", str(data), "--n-train", "150", "--n-val",
                "40", "--n-test", "30", "--n-ged", "4", "--ged-workers", "1", "--epochs", "1", "--m-y", "40",
                "--m-x", "60"])
    report = json.loads((tmp_path / "dsokr_qm9.json").read_text())
    assert (report["n_train"], report["n_val"], report["n_test"], report["n_candidates"]) == (150, 40, 30, 180)
    assert list(report["models"]) == ["random", "dsokr/transformer/wl-subtree", "sisokr/smiles-ngram/wl-subtree"]
    for name, entry in report["models"].items():
        test = entry["test"]
        assert 0.0 <= test["hit@1"] <= test["hit@10"] <= 1.0 and 1.0 <= test["mean_rank"] <= 181
        assert entry["fit_s"] >= 0.0 and entry["eval_s"] >= 0.0
        if name != "random":
            assert test["n_ged"] == 4 and np.isfinite(test["ged_mean"]) and test["ged_bonds_mean"] >= 0


def test_mkl_by_name_is_the_sisokr_default_input_kernel():
    """``--input-kernel mkl`` claims SISOKR's kernel: the registry defaults of ``mkl`` are its parameters."""
    from molpredict.models.okr import DEFAULT_INPUT_KERNEL
    from molpredict.registry import create
    from molpredict.specs import parse_spec
    default = parse_spec(DEFAULT_INPUT_KERNEL)
    by_name = create("input_kernel", "mkl")
    assert default.name == "mkl" and default.params
    assert all(getattr(by_name, key) == value for key, value in default.params.items())


def test_validation_split_is_by_structure(bench):
    mols = [Molecule.from_smiles(s) for s in ("CCO", "CCN", "CCC", "CCCl", "CCBr", "CCI")]
    molecules = [mols[i % 6] for i in range(60)] + [Molecule.from_smiles("CCCC")]  # the last has no set
    sets = {m.inchikey14: [] for m in mols}
    stop, evl = bench.validation_split(molecules, sets, n_stop=100, seed=0)
    stop_keys, eval_keys = {molecules[i].inchikey14 for i in stop}, {molecules[i].inchikey14 for i in evl}
    assert len(stop_keys) == 2 and len(eval_keys) == 4 and not stop_keys & eval_keys  # a third of 6 structures
    assert sorted(stop + evl) == list(range(60))  # every spectrum with a set, once; the one without none
    capped, evl2 = bench.validation_split(molecules, sets, n_stop=7, seed=0)
    assert len(capped) == 7 and set(capped) <= set(stop) and evl2 == evl
