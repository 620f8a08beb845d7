"""Molecules: parsing, identity, fingerprints, graphs, formulas and adducts against hand-computed values."""
from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest

from molpredict.errors import InputError, SpecError
from molpredict.chem.molecules import (
    ADDUCTS,
    DEFAULT_ADDUCTS,
    ELECTRON_MASS,
    Adduct,
    Molecule,
    fingerprint_matrix,
    formula_mass,
    neutral_mass,
    normalize_formula,
    parse_adduct,
    parse_formula,
    precursor_mz,
    spectrum_structure_key,
    to_grakel_graph,
)

CAFFEINE = "Cn1c(=O)c2c(ncn2C)n(C)c1=O"
# Monoisotopic masses (AME 2016 / CODATA), typed in by hand, independent of RDKit.
H, C, N, O, NA = 1.00782503223, 12.0, 14.00307400443, 15.99491461957, 22.9897692820
E = 0.00054857990907
PROTON = H - E


# -- Molecule ----------------------------------------------------------------------------------------------

def test_caffeine_known_values():
    m = Molecule.from_smiles(CAFFEINE, name="caffeine", id="q1", source="test")
    assert m.formula == "C8H10N4O2"
    assert m.monoisotopic_mass == pytest.approx(194.080376, abs=1e-6)
    assert m.monoisotopic_mass == pytest.approx(8 * C + 10 * H + 4 * N + 2 * O, abs=1e-6)
    assert m.inchikey == "RYYVLZVUVIJVGH-UHFFFAOYSA-N"
    assert m.inchikey14 == "RYYVLZVUVIJVGH"
    assert (m.name, m.id, m.source) == ("caffeine", "q1", "test")


def test_canonical_smiles_and_equality_by_inchikey():
    a = Molecule.from_smiles("OCC")
    b = Molecule.from_smiles("C(O)C")
    assert a.smiles == b.smiles == "CCO"
    assert a == b and hash(a) == hash(b)
    assert len({a, b, Molecule.from_smiles("CCN")}) == 2
    # Isomeric SMILES is kept: the two enantiomers of alanine differ in full key, share the first block.
    l_ala = Molecule.from_smiles("C[C@@H](C(=O)O)N")
    d_ala = Molecule.from_smiles("C[C@H](C(=O)O)N")
    assert "@" in l_ala.smiles
    assert l_ala != d_ala and l_ala.inchikey14 == d_ala.inchikey14


def test_spectrum_structure_key_is_the_inchikey_block_or_the_parsed_smiles():
    """One structure is one key however its SMILES is written; evaluation and property training share it."""
    from types import SimpleNamespace as Record

    caffeine_key = "RYYVLZVUVIJVGH"  # caffeine's InChIKey first block, from PubChem
    parsed: dict = {}
    assert spectrum_structure_key(Record(inchikey="RYYVLZVUVIJVGH-UHFFFAOYSA-N", smiles="CCO")) == caffeine_key
    assert spectrum_structure_key(Record(inchikey=None, smiles=CAFFEINE), parsed) == caffeine_key
    assert spectrum_structure_key(Record(inchikey="", smiles="CN1C=NC2=C1C(=O)N(C(=O)N2C)C"), parsed) == caffeine_key
    assert spectrum_structure_key(Record(inchikey=None, smiles="OCC")) == spectrum_structure_key(
        Record(inchikey=None, smiles="C(O)C")) == "LFQSCWFLJHTTHZ"  # ethanol
    assert parsed == {CAFFEINE: caffeine_key, "CN1C=NC2=C1C(=O)N(C(=O)N2C)C": caffeine_key}
    for unusable in (Record(inchikey=None, smiles=None), Record(inchikey=None, smiles="  "),
                     Record(inchikey=None, smiles="C1CC(")):
        assert spectrum_structure_key(unusable) is None


def test_from_inchi():
    m = Molecule.from_inchi("InChI=1S/C8H10N4O2/c1-10-4-9-6-5(10)7(13)12(3)8(14)11(6)2/h4H,1-3H3")
    assert m.inchikey == "RYYVLZVUVIJVGH-UHFFFAOYSA-N"
    assert m == Molecule.from_smiles(CAFFEINE)


@pytest.mark.parametrize("bad", ["C1CC", "not a smiles", "", "C(C)(C)(C)(C)C"])
def test_unparsable_smiles_raises_one_line_input_error(bad, capfd):
    with pytest.raises(InputError) as info:
        Molecule.from_smiles(bad, id="rec7")
    message = str(info.value)
    assert "smiles" in message and "rec7" in message and "\n" not in message
    assert capfd.readouterr().err == ""  # RDKit's own logging is silenced


def test_unparsable_inchi_raises():
    with pytest.raises(InputError, match="inchi"):
        Molecule.from_inchi("InChI=garbage")


def test_cheap_constructor_does_not_parse_until_needed():
    m = Molecule("CCO", inchikey="LFQSCWFLJHTTHZ-UHFFFAOYSA-N", formula="C2H6O", monoisotopic_mass=46.041865)
    assert (m.inchikey14, m.formula, m.monoisotopic_mass) == ("LFQSCWFLJHTTHZ", "C2H6O", 46.041865)
    assert m._mol is None
    m.fingerprint()
    assert m._mol is not None
    # Fields not given are computed on demand.
    lazy = Molecule("CCO")
    assert lazy.inchikey == "LFQSCWFLJHTTHZ-UHFFFAOYSA-N"
    assert lazy.formula == "C2H6O"
    assert lazy.monoisotopic_mass == pytest.approx(2 * C + 6 * H + O, abs=1e-6)
    # An unparsable SMILES only fails when something needs the structure.
    broken = Molecule("C1CC", inchikey="X-Y-Z")
    assert broken.inchikey14 == "X"
    with pytest.raises(InputError, match="smiles"):
        broken.rdkit_mol


def test_pickle_round_trip_drops_caches():
    m = Molecule.from_smiles(CAFFEINE, name="caffeine")
    m.fingerprint()
    back = pickle.loads(pickle.dumps(m))
    assert back == m and back.name == "caffeine" and back.formula == m.formula
    assert back._mol is None and back._fps is None
    np.testing.assert_array_equal(back.fingerprint(), m.fingerprint())


# -- fingerprints ------------------------------------------------------------------------------------------

def test_fingerprint_shapes_dtypes_and_cache():
    m = Molecule.from_smiles(CAFFEINE)
    bits = m.fingerprint()
    assert bits.shape == (2048,) and bits.dtype == np.uint8 and set(np.unique(bits)) <= {0, 1}
    assert m.fingerprint() is bits  # cached
    assert not bits.flags.writeable
    counts = m.fingerprint(counts=True)
    assert counts.shape == (2048,) and counts.dtype == np.float32
    np.testing.assert_array_equal(counts > 0, bits > 0)
    assert counts.sum() > bits.sum()  # caffeine repeats environments (three N-methyls)
    assert m.fingerprint(size=1024).shape == (1024,)
    assert m.fingerprint(radius=3).sum() >= bits.sum()
    maccs = m.fingerprint("maccs")
    assert maccs.shape == (167,) and maccs.dtype == np.uint8 and maccs[0] == 0  # bit 0 is unused by MACCS
    assert m.fingerprint("maccs", size=64) is maccs  # size ignored, same cache entry
    topo = m.fingerprint("rdkit", size=512)
    assert topo.shape == (512,) and topo.dtype == np.uint8 and topo.sum() > 0


def test_fingerprint_bad_settings():
    m = Molecule.from_smiles("CCO")
    with pytest.raises(SpecError, match="unknown fingerprint kind"):
        m.fingerprint("ecfp")
    with pytest.raises(SpecError):
        m.fingerprint("maccs", counts=True)


def test_single_atom_fingerprint():
    assert Molecule.from_smiles("C").fingerprint().sum() == 1


@pytest.mark.parametrize("kind,counts", [("morgan", False), ("morgan", True), ("maccs", False), ("rdkit", False)])
def test_fingerprint_matrix_equals_per_molecule(kind, counts):
    smiles = [CAFFEINE, "CCO", "c1ccccc1O", "C", "CC(=O)Nc1ccc(O)cc1", "OC(=O)C[C@H](N)C(=O)O"]
    mols = [Molecule.from_smiles(s) for s in smiles]
    expected = np.stack([m.fingerprint(kind, radius=2, size=1024, counts=counts) for m in mols])
    for inputs in (mols, smiles, [Molecule(s) for s in smiles]):
        got = fingerprint_matrix(inputs, kind=kind, size=1024, counts=counts, chunk_size=2)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
    parallel = fingerprint_matrix(smiles, kind=kind, size=1024, counts=counts, n_jobs=2, chunk_size=2)
    np.testing.assert_array_equal(parallel, expected)


def test_remembered_fingerprints_parse_each_record_once(monkeypatch):
    """Inside the block a record is parsed and fingerprinted once however many kernels featurise it (same rows
    as without the block); outside it, and after it, nothing is kept on the records."""
    import molpredict.chem.molecules as molecules

    smiles = [CAFFEINE, "CCO", "c1ccccc1O", "C", "CC(=O)Nc1ccc(O)cc1"]
    expected = fingerprint_matrix(smiles, size=512)
    parses = []
    original = molecules._parse_smiles
    monkeypatch.setattr(molecules, "_parse_smiles", lambda s: parses.append(s) or original(s))
    records = [Molecule(s) for s in smiles]
    outside = Molecule("CCN")
    with molecules.remembered_fingerprints(records[:4]):
        first = fingerprint_matrix(records + [outside], size=512)
        second = fingerprint_matrix(records + [outside], size=512)
        other_setting = fingerprint_matrix(records[:1], size=256)
        np.testing.assert_array_equal(first[:5], expected)
        np.testing.assert_array_equal(second, first)
        first[:] = 0  # the caller's matrix is its own: the kept rows are copies
        np.testing.assert_array_equal(fingerprint_matrix(records, size=512), expected)
    # the 4 remembered records parsed once (two settings for the first), the others at every call
    assert sorted(parses) == sorted(smiles[:4] + [smiles[0]] + 3 * smiles[4:] + 2 * ["CCN"])
    assert other_setting.shape == (1, 256)
    assert all(m._fps is None for m in records + [outside])
    assert records[0].fingerprint(size=512).sum() == expected[0].sum()  # the record's own cache still works


def test_fingerprints_on_cores_are_the_ones_the_kernel_then_reads(monkeypatch):
    """Training fingerprints its validation candidates on worker processes first: inside the block the records
    then carry exactly the rows of an inline featurisation, parsed in the workers, and the kernel's own
    featurisation parses nothing more; the training's helper does the same from a model's output kernel spec and
    leaves other output kernels alone."""
    import molpredict.chem.molecules as molecules
    import molpredict.kernels.fingerprints as fingerprints
    from molpredict.kernels.fingerprints import TanimotoKernel
    from molpredict.training.pipeline import _fingerprint_on_cores

    smiles = [CAFFEINE, "CCO", "c1ccccc1O", "C", "CC(=O)Nc1ccc(O)cc1"]
    expected = fingerprint_matrix(smiles, size=512)
    key = molecules._fp_key("morgan", 2, 512, False)
    monkeypatch.setattr(fingerprints, "_ON_CORES_BLOCK", 4)  # two blocks
    parses = []
    original = molecules._parse_smiles
    monkeypatch.setattr(molecules, "_parse_smiles", lambda s: parses.append(s) or original(s))
    records = [Molecule(s) for s in smiles]
    kernel = TanimotoKernel(size=512)
    with molecules.remembered_fingerprints(records):
        kernel.fingerprint_on_cores(records, n_jobs=2, chunk_size=2)
        assert parses == smiles[4:]  # the first block on 2 processes, the last one (one record) inline
        np.testing.assert_array_equal(np.stack([m._fps[key] for m in records]), expected)
        np.testing.assert_array_equal(kernel.featurize(records).matrix, expected)
        assert parses == smiles[4:]
    assert all(m._fps is None for m in records)

    class Model:  # what the helper reads of a model: its output kernel spec, nested as a model parameter
        output_kernel = "tanimoto:size=512;radius=2"

    fresh = [Molecule(s) for s in smiles]
    other = Molecule("CCN")
    with molecules.remembered_fingerprints(fresh + [other]):
        _fingerprint_on_cores(Model(), fresh)
        np.testing.assert_array_equal(np.stack([m._fps[key] for m in fresh]), expected)
        for spec in ("wl-subtree", "tanimoto:size=512|1024", "tanimoto|gaussian-tanimoto", "not-a-kernel"):
            # left to featurise as before
            Model.output_kernel = spec
            _fingerprint_on_cores(Model(), [other])
        assert other._fps is None


def test_fingerprint_matrix_survives_invalid_smiles():
    smiles = ["CCO", "C1CC", "c1ccccc1", "", "xyz"]
    with pytest.warns(RuntimeWarning, match="3 of 5"):
        fps = fingerprint_matrix(smiles, size=256)
    assert fps.shape == (5, 256)
    assert fps[[1, 3, 4]].sum() == 0 and fps[0].sum() > 0 and fps[2].sum() > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fingerprint_matrix([], size=16).shape == (0, 16)


# -- graphs ------------------------------------------------------------------------------------------------

def test_graph_form():
    edges, nodes, bonds = Molecule.from_smiles("OC(=O)c1ccccc1").graph()
    assert nodes == {0: "O", 1: "C", 2: "O", 3: "C", 4: "C", 5: "C", 6: "C", 7: "C", 8: "C"}
    assert len(edges) == 9 and sum(len(v) for v in edges.values()) == 2 * 9  # 9 bonds, both directions
    assert all(i in edges[j] for i in edges for j in edges[i])
    assert bonds[(0, 1)] == bonds[(1, 0)] == "SINGLE"
    assert bonds[(1, 2)] == "DOUBLE"
    assert bonds[(3, 4)] == "AROMATIC"
    assert set(bonds) == {(i, j) for i in edges for j in edges[i]}
    assert Molecule.from_smiles("CCO").graph(bond_labels=False)[2] is None


def test_isolated_atom_graph():
    edges, nodes, bonds = Molecule.from_smiles("C").graph()
    assert edges == {0: {}} and nodes == {0: "C"} and bonds == {}
    assert to_grakel_graph(Molecule.from_smiles("C")).nv() == 1


def test_graphs_work_with_grakel_wl():
    from grakel.kernels import VertexHistogram, WeisfeilerLehman

    mols = [Molecule.from_smiles(s) for s in ("CCO", "C", "c1ccccc1O")]
    kernel = WeisfeilerLehman(n_iter=2, base_graph_kernel=VertexHistogram, normalize=True)
    K = kernel.fit_transform([list(m.graph()) for m in mols])
    assert K.shape == (3, 3)
    np.testing.assert_allclose(np.diag(K), 1.0)
    np.testing.assert_allclose(K, K.T)
    assert 0 < K[0, 2] < 1
    K2 = WeisfeilerLehman(n_iter=2, base_graph_kernel=VertexHistogram, normalize=True).fit_transform(
        [to_grakel_graph(m) for m in mols])
    np.testing.assert_allclose(K2, K)


# -- formulas ----------------------------------------------------------------------------------------------

def test_formula_mass_and_normalisation():
    assert formula_mass("H2O") == pytest.approx(2 * H + O, abs=1e-7)
    assert formula_mass("C8H10N4O2") == pytest.approx(194.080376, abs=1e-6)
    assert formula_mass("C4H12N+") == pytest.approx(4 * C + 12 * H + N - E, abs=1e-7)
    assert formula_mass("C2H3O2-") == pytest.approx(2 * C + 3 * H + 2 * O + E, abs=1e-7)
    assert normalize_formula("OH2") == normalize_formula("H2O") == "H2O"
    assert normalize_formula("CH3COOH") == "C2H4O2"
    assert normalize_formula("O2N4C8H10") == "C8H10N4O2"
    assert normalize_formula("ClNa") == "ClNa"
    assert normalize_formula("NaCl") == "ClNa"
    assert normalize_formula("CoH8N6O4") == "H8CoN6O4"  # RDKit puts H first even without carbon
    assert normalize_formula("NH3") == "H3N"
    assert normalize_formula("CH4") == "CH4"
    assert normalize_formula("C14H30N2O4+2") == "C14H30N2O4+2"
    assert parse_formula("C2H3O2-") == ({"C": 2, "H": 3, "O": 2}, -1)


@pytest.mark.parametrize("smiles", [CAFFEINE, "O", "N", "[Na+].[Cl-]", "C[N+](C)(C)C", "CC(=O)[O-]",
                                    "OC(=O)C(Cl)(Cl)Br", "FC(F)(F)S(=O)(=O)O", "[NH4+].[NH4+]",
                                    "B(O)B(O)", "[Co]"])
def test_normalised_formula_matches_rdkit(smiles):
    m = Molecule.from_smiles(smiles)
    assert normalize_formula(m.formula) == m.formula
    assert formula_mass(m.formula) == pytest.approx(m.monoisotopic_mass, abs=1e-6)


@pytest.mark.parametrize("bad", ["", "C8H10X", "c8h10", "H2O 2+", "C(H)2", "12C"])
def test_bad_formula(bad):
    with pytest.raises(InputError, match="formula"):
        normalize_formula(bad)


# -- adducts -----------------------------------------------------------------------------------------------

CAFFEINE_MASS = 8 * C + 10 * H + 4 * N + 2 * O  # 194.0803756


@pytest.mark.parametrize("name,mz", [
    ("[M+H]+", CAFFEINE_MASS + H - E),                 # 195.087652
    ("[M+Na]+", CAFFEINE_MASS + NA - E),               # 217.069596
    ("[M-H]-", CAFFEINE_MASS - H + E),                 # 193.073099
    ("[M+2H]2+", (CAFFEINE_MASS + 2 * H - 2 * E) / 2),  # 98.047464
    ("[M+NH4]+", CAFFEINE_MASS + N + 4 * H - E),
    ("[M]+", CAFFEINE_MASS - E),
    ("[M-H2O+H]+", CAFFEINE_MASS - 2 * H - O + H - E),
    ("[M+HCOO]-", CAFFEINE_MASS + C + H + 2 * O + E),
    ("[2M+H]+", 2 * CAFFEINE_MASS + H - E),
    ("[M-2H]2-", (CAFFEINE_MASS - 2 * H + 2 * E) / 2),
])
def test_adduct_conversions_hand_computed(name, mz):
    assert precursor_mz(CAFFEINE_MASS, name) == pytest.approx(mz, abs=2e-6)
    assert neutral_mass(mz, name) == pytest.approx(CAFFEINE_MASS, abs=2e-6)


def test_adduct_hand_values_printed():
    # The same numbers as commonly tabulated for caffeine.
    assert precursor_mz(194.080376, "[M+H]+") == pytest.approx(195.087652, abs=1e-6)
    assert precursor_mz(194.080376, "[M+Na]+") == pytest.approx(217.069596, abs=1e-6)
    assert precursor_mz(194.080376, "[M-H]-") == pytest.approx(193.073100, abs=1e-6)
    assert precursor_mz(194.080376, "[M+2H]2+") == pytest.approx(98.047464, abs=1e-6)
    assert parse_adduct("[M+H]+").mass_shift == pytest.approx(1.00727646688, abs=1e-7)  # RDKit H mass, 9 digits
    assert ELECTRON_MASS == pytest.approx(E, rel=1e-9)


def test_adduct_table_and_aliases():
    for name in ["[M+H]+", "[M+Na]+", "[M+K]+", "[M+NH4]+", "[M]+", "[M]+*", "[M+2H]2+", "[M-H2O+H]+",
                 "[M+H-NH3]+", "[M-H]-", "[M-2H]2-", "[M+Cl]-", "[M+HCOO]-", "[M+CH3COO]-", "[M+CH3COOH-H]-"]:
        assert name in ADDUCTS and parse_adduct(name).name == name
    assert parse_adduct("[M+2H]++") is ADDUCTS["[M+2H]2+"]
    assert parse_adduct("[M+H-H2O]+") is ADDUCTS["[M-H2O+H]+"]
    assert parse_adduct("[M+FA-H]-") is ADDUCTS["[M+HCOO]-"]
    assert parse_adduct("[M+Hac-H]-") is ADDUCTS["[M+CH3COOH-H]-"]
    assert parse_adduct("  [M + H] + ") is ADDUCTS["[M+H]+"]
    assert parse_adduct(ADDUCTS["[M-H]-"]) is ADDUCTS["[M-H]-"]
    a = ADDUCTS["[M+2H]2+"]
    assert (a.charge, a.multiplier, a.ion_mode) == (2, 1, "positive")
    assert ADDUCTS["[M-H]-"].ion_mode == "negative"
    assert ADDUCTS["[M+CH3COO]-"].mass_shift == pytest.approx(ADDUCTS["[M+CH3COOH-H]-"].mass_shift)
    assert ADDUCTS["[M]+*"].mass_shift == ADDUCTS["[M]+"].mass_shift
    assert all(a.charge > 0 for a in DEFAULT_ADDUCTS["positive"])
    assert all(a.charge < 0 for a in DEFAULT_ADDUCTS["negative"])
    assert DEFAULT_ADDUCTS["positive"][0].name == "[M+H]+" and DEFAULT_ADDUCTS["negative"][0].name == "[M-H]-"


def test_adducts_parsed_from_composition():
    a = parse_adduct("[M-H-CO2]-")
    assert isinstance(a, Adduct) and a.charge == -1
    assert a.mass_shift == pytest.approx(-H - C - 2 * O + E, abs=1e-7)
    b = parse_adduct("[M-H-CO2-2HF]-")
    assert b.mass_shift == pytest.approx(-H - C - 2 * O - 2 * (H + 18.99840316273) + E, abs=1e-6)
    assert parse_adduct("[2M-H]-").multiplier == 2


@pytest.mark.parametrize("bad", ["[M+X]+", "M+H", "[M+H]", "foo", "", "[M+H]+-", "[M+Hx]+"])
def test_unknown_adduct_raises_naming_it(bad):
    with pytest.raises(InputError) as info:
        parse_adduct(bad)
    assert "adduct" in str(info.value) and repr(bad) in str(info.value)


def test_mass_conversions_on_arrays():
    mz = np.array([100.0, 200.0, 300.0])
    m = neutral_mass(mz, "[M+Na]+")
    assert isinstance(m, np.ndarray) and m.shape == (3,)
    np.testing.assert_allclose(precursor_mz(m, "[M+Na]+"), mz, rtol=0, atol=1e-9)


def test_chiral_morgan_fingerprints_tell_stereoisomers_apart():
    from rdkit import Chem
    from rdkit.Chem import rdFingerprintGenerator

    l_ala, d_ala = Molecule.from_smiles("C[C@H](N)C(=O)O"), Molecule.from_smiles("C[C@@H](N)C(=O)O")
    assert np.array_equal(l_ala.fingerprint(), d_ala.fingerprint())
    assert not np.array_equal(l_ala.fingerprint(chiral=True), d_ala.fingerprint(chiral=True))
    # against RDKit's generator called directly
    reference = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=1024, includeChirality=True)
    for m in (l_ala, d_ala):
        expected = reference.GetFingerprintAsNumPy(Chem.MolFromSmiles(m.smiles))
        assert np.array_equal(m.fingerprint(size=1024, chiral=True), expected)
    # the batch path, and its cache key keeps chiral and plain fingerprints apart
    matrix = fingerprint_matrix([l_ala, d_ala, "C[C@H](N)C(=O)O"], size=1024, chiral=True)
    assert np.array_equal(matrix[0], matrix[2]) and not np.array_equal(matrix[0], matrix[1])
    assert np.array_equal(matrix[0], l_ala.fingerprint(size=1024, chiral=True))
    with pytest.raises(SpecError, match="Morgan"):
        l_ala.fingerprint(kind="maccs", chiral=True)
