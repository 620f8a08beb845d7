"""Candidate libraries: readers and skip reports, selection against brute force, the cache, candidate sets, CLI."""
from __future__ import annotations

import gzip
import json
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import FIXTURES, require_shared
from molpredict.cache import LIBRARY_CACHE_FORMAT, file_sha256
from molpredict.cache import library_cache_dir as cache_dir
from molpredict.chem.candidates import (
    COLUMNS,
    CandidateLibrary,
    LoadReport,
    candidate_set_molecules,
    dedupe,
    describe_many,
    describe_smiles,
    load_candidate_sets,
    read_library,
)
from molpredict.errors import InputError
from molpredict.chem.molecules import Molecule, neutral_mass, normalize_formula, parse_adduct

MOLS = FIXTURES / "molecules"


def _quiet(function, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return function(*args, **kwargs)


@pytest.fixture(autouse=True)
def _private_home(tmp_path, monkeypatch):
    """Caches go to a throw-away MOLPREDICT_HOME."""
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))


# -- readers -----------------------------------------------------------------------------------------------

def test_tsv_with_computed_columns_and_bad_rows():
    with pytest.warns(UserWarning, match="4 of 7 records kept, 3 skipped"):
        lib = read_library(MOLS / "library.tsv")
    assert len(lib) == 4
    assert list(lib.name) == ["caffeine", "ethanol", "aspirin", "phenol"]
    assert list(lib.id) == ["c1", "c2", "c6", "c7"]
    assert list(lib.source) == ["hand", "hand", None, "hand"]  # empty optional cell -> missing
    caffeine = lib[0]
    assert caffeine.formula == "C8H10N4O2" and caffeine.inchikey == "RYYVLZVUVIJVGH-UHFFFAOYSA-N"
    assert caffeine.monoisotopic_mass == pytest.approx(194.080376, abs=1e-6)
    assert lib.smiles[1] == "CCO"  # computed rows get RDKit canonical SMILES
    assert list(lib.inchikey14) == [k.split("-")[0] for k in lib.inchikey]
    assert lib.monoisotopic_mass.dtype == np.float64
    skipped = [(s.line, s.field) for s in lib.report.skipped]
    assert skipped == [(4, "smiles"), (5, "smiles"), (6, None)]
    assert all(s.path.endswith("library.tsv") for s in lib.report.skipped)
    assert "C1CC" in lib.report.skipped[1].reason and "fields" in lib.report.skipped[2].reason
    assert "line 5, field smiles" in str(lib.report.skipped[1])


def test_complete_tsv_is_taken_as_given(monkeypatch):
    import molpredict.chem.candidates as cand

    monkeypatch.setattr(cand, "describe_many", lambda *a, **k: pytest.fail("RDKit must not run"))
    lib = read_library(MOLS / "complete.tsv")
    assert len(lib) == 3 and lib.report.n_skipped == 0
    assert lib.smiles[0] == "CN1C(=O)N(C)c2ncn(C)c2C1=O"  # not re-canonicalised
    assert list(lib.monoisotopic_mass) == [194.080376, 46.041865, 94.041865]
    assert list(lib.source) == ["a", "b", None]
    assert lib.name is None and lib.id is None
    assert lib[0].name is None and lib[0].inchikey14 == "RYYVLZVUVIJVGH"


def test_complete_tsv_with_bad_cells_falls_back_and_reports(tmp_path):
    lines = (MOLS / "complete.tsv").read_text().splitlines()
    lines[2] = lines[2].replace("46.041865", "heavy")
    lines.append("XLYOFNOQVPJJNP-UHFFFAOYSA-N\t\tH2O\t18.010565\tc")
    lines.append("only\ttwo")
    path = tmp_path / "bad.tsv.gz"
    with gzip.open(path, "wt") as handle:
        handle.write("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match="2 of 5 records kept"):
        lib = read_library(path)
    assert list(lib.inchikey14) == ["RYYVLZVUVIJVGH", "ISWSIDIOOBJBQZ"]
    assert [(s.line, s.field) for s in lib.report.skipped] == [(3, "monoisotopic_mass"), (5, "smiles"), (6, None)]


def test_cid_column_is_the_id(tmp_path):
    path = tmp_path / "chebi_like.tsv"
    path.write_text("CID\tSMILES\n71586\tCCO\n5280\tc1ccccc1O\n")
    library = CandidateLibrary.from_tsv(path, cache=False)
    assert list(library.column("id")) == ["71586", "5280"]
    both = tmp_path / "both.tsv"
    both.write_text("cid\tid\tsmiles\n1\ta\tCCO\n")
    assert list(CandidateLibrary.from_tsv(both, cache=False).column("id")) == ["a"]


def test_gzipped_tsv_equals_plain(tmp_path):
    path = tmp_path / "library.tsv.gz"
    path.write_bytes(gzip.compress((MOLS / "library.tsv").read_bytes()))
    plain = _quiet(read_library, MOLS / "library.tsv")
    packed = _quiet(read_library, path)
    for column in COLUMNS:
        np.testing.assert_array_equal(plain.column(column), packed.column(column))


def test_a_truncated_gzipped_tsv_is_one_line_naming_it(tmp_path):
    """Cut in the middle of its compressed stream, a complete library (every computed column, Arrow's reader) and a
    SMILES-only one (the row reader) both fail with one line naming the file, not pyarrow's or gzip's error."""
    complete = CandidateLibrary.from_smiles(["CCO", "c1ccccc1", "CC(=O)O", "CCN", "CCCC"] * 200)
    complete.to_tsv(tmp_path / "full.tsv")
    (tmp_path / "smiles.tsv").write_text("smiles\n" + "CCO\nCCN\nCCCC\n" * 400)
    for name in ("full.tsv", "smiles.tsv"):
        packed = gzip.compress((tmp_path / name).read_bytes())
        cut = tmp_path / f"{name}.gz"
        cut.write_bytes(packed[: len(packed) // 2])
        with pytest.raises(InputError, match=f"^{cut}: the compressed file is truncated or damaged \\(EOFError"):
            read_library(cut, cache=False)


def test_smiles_file():
    with pytest.warns(UserWarning, match="3 of 4"):
        lib = read_library(MOLS / "small.smi")
    assert list(lib.name) == ["caffeine", "ethanol (grain alcohol)", None]
    assert list(lib.formula) == ["C8H10N4O2", "C2H6O", "C6H6O"]
    assert [(s.line, s.field) for s in lib.report.skipped] == [(6, "smiles")]
    assert not lib.has_column("source")
    with_source = _quiet(CandidateLibrary.from_smiles_file, MOLS / "small.smi", source="mine")
    assert set(with_source.source) == {"mine"}


def test_sdf_file():
    with pytest.warns(UserWarning, match="2 of 3"):
        lib = read_library(MOLS / "small.sdf")
    assert list(lib.smiles) == ["CCO", "Oc1ccccc1"]
    assert list(lib.name) == ["grain alcohol", "phenol"]  # NAME item, else title line
    assert list(lib.id) == ["s1", None]
    assert list(lib.source) == [None, "handmade"]
    assert [(s.line, s.field) for s in lib.report.skipped] == [(18, "molblock")]


def test_sdf_gz(tmp_path):
    path = tmp_path / "small.sdf.gz"
    path.write_bytes(gzip.compress((MOLS / "small.sdf").read_bytes()))
    assert list(_quiet(read_library, path).smiles) == ["CCO", "Oc1ccccc1"]


def test_files_that_are_not_libraries(tmp_path):
    (tmp_path / "nosmiles.tsv").write_text("name\tmass\nx\t1.0\n")
    (tmp_path / "blob.tsv").write_bytes(b"\x00\x01\x02\xff\xfe" * 100)
    (tmp_path / "spectra.mgf").write_text("BEGIN IONS\nPEPMASS=100\nEND IONS\n")
    (tmp_path / "empty.sdf").write_text("\n")
    cases = {"nosmiles.tsv": "smiles", "blob.tsv": "not a text", "spectra.mgf": "not a candidate library",
             "missing.tsv": "no such file", "empty.sdf": "no SDF records"}
    for name, expected in cases.items():
        with pytest.raises(InputError) as info:
            read_library(tmp_path / name)
        message = str(info.value)
        assert expected in message and name in message and "\n" not in message


def test_tsv_without_extension_is_sniffed(tmp_path):
    path = tmp_path / "library"
    shutil.copy(MOLS / "complete.tsv", path)
    assert len(read_library(path)) == 3


def test_from_smiles_and_molecules_and_dedupe():
    lib = _quiet(CandidateLibrary.from_smiles, ["OCC", "C(O)C", "xx", "c1ccccc1"], names=["a", "b", "c", "d"])
    assert len(lib) == 3 and lib.report.n_skipped == 1 and lib.report.skipped[0].line == 3
    report = LoadReport("x", n_read=3)
    unique = dedupe(lib, report)
    assert list(unique.name) == ["a", "d"] and report.n_duplicates == 1
    again = CandidateLibrary.from_molecules([Molecule.from_smiles("CCO", name="e")], source="s")
    assert again[0] == Molecule.from_smiles("OCC") and again.source[0] == "s"


def test_describe_many_parallel_equals_serial(monkeypatch):
    import molpredict.chem.candidates as cand

    smiles = ["CCO", "bad(", "c1ccccc1", "CC(=O)O", "C"] * 3
    serial = describe_many(smiles, n_jobs=1)
    monkeypatch.setattr(cand, "_PARALLEL_MIN", 1)
    assert describe_many(smiles, n_jobs=2) == serial
    assert serial[1] is None and serial[0] == describe_smiles("OCC")


# -- rows and columns --------------------------------------------------------------------------------------

def _synthetic(n: int, seed: int = 0) -> CandidateLibrary:
    """A library of made-up rows (no RDKit): random masses, formulas drawn from a small set, 3 sources."""
    rng = np.random.default_rng(seed)
    formulas = np.array(["C8H10N4O2", "C2H6O", "H2O", "C6H6O", "C4H12N+", "ClNa"])
    return CandidateLibrary({
        "smiles": [f"C{'C' * (i % 7)}O" for i in range(n)],
        "inchikey": [f"K{i:013d}-UHFFFAOYSA-N" for i in range(n)],
        "formula": formulas[rng.integers(0, len(formulas), n)],
        "monoisotopic_mass": np.round(rng.uniform(50, 1000, n), 4),  # rounding makes exact ties
        "source": np.array(["a", "b", "c"])[rng.integers(0, 3, n)],
        "name": [f"m{i}" for i in range(n)],
    })


def test_indexing_molecules_subset_lookup():
    lib = _synthetic(50)
    m = lib[7]
    assert isinstance(m, Molecule) and m._mol is None  # cheap: nothing parsed
    assert (m.smiles, m.inchikey, m.inchikey14, m.name) == (lib.smiles[7], lib.inchikey[7], "K0000000000007", "m7")
    assert m.monoisotopic_mass == lib.monoisotopic_mass[7] and m.formula == lib.formula[7]
    assert lib[-1].name == "m49"
    with pytest.raises(IndexError):
        lib[50]
    picked = lib.molecules([3, 1, 3])
    assert [x.name for x in picked] == ["m3", "m1", "m3"]
    assert lib.molecules([]) == []
    sub = lib.subset(np.array([10, 2]))
    assert list(sub.name) == ["m10", "m2"] and len(sub) == 2
    assert sub.select_by_formula(lib.formula[10]).tolist() in ([0], [0, 1])
    assert lib.lookup(["K0000000000012", "nope", "K0000000000000"]).tolist() == [12, -1, 0]
    assert [x.name for x in lib][:3] == ["m0", "m1", "m2"]
    assert not lib.smiles.flags.writeable


def test_select_by_mass_against_brute_force():
    lib = _synthetic(5000)
    masses = lib.monoisotopic_mass
    rng = np.random.default_rng(1)
    queries = np.concatenate([rng.uniform(40, 1010, 300), masses[:50],  # exact hits
                              masses[:50] * (1 + 10e-6), masses[:50] * (1 - 9.99e-6)])  # edges of the window
    for ppm in (1, 10, 50):
        for q in queries:
            expected = np.flatnonzero(np.abs(masses - q) <= q * ppm * 1e-6)
            np.testing.assert_array_equal(lib.select_by_mass(q, ppm=ppm), expected)
        batch = lib.select_by_masses(queries, ppm=ppm)
        for q, got in zip(queries, batch):
            np.testing.assert_array_equal(got, np.flatnonzero(np.abs(masses - q) <= q * ppm * 1e-6))
    assert lib.select_by_mass(1e6).size == 0 and lib.select_by_mass(1.0).dtype == np.int64


def test_select_by_precursor_uses_adducts():
    lib = _synthetic(3000)
    mz = 400.0
    adducts = ["[M+H]+", "[M+Na]+"]
    masses = lib.monoisotopic_mass
    expected = set()
    for a in adducts:
        m = neutral_mass(mz, a)
        expected |= set(np.flatnonzero(np.abs(masses - m) <= m * 20e-6).tolist())
    got = lib.select_by_precursor(mz, adducts, ppm=20)
    assert got.tolist() == sorted(expected)
    np.testing.assert_array_equal(lib.select_by_precursor(mz, parse_adduct("[M+H]+"), ppm=20),
                                  lib.select_by_mass(neutral_mass(mz, "[M+H]+"), ppm=20))


def test_select_by_formula_and_source_against_brute_force():
    lib = _synthetic(2000)
    for query in ["C8H10N4O2", "OH2", "H2O", "C2H6O", "C4H12N+", "NaCl", "C99"]:
        key = normalize_formula(query)
        expected = np.flatnonzero([normalize_formula(f) == key for f in lib.formula])
        got = lib.select_by_formula(query)
        np.testing.assert_array_equal(got, expected)
        assert got.dtype == np.int64
    assert lib.select_by_formula("OH2").size > 0
    with pytest.raises(InputError, match="formula"):
        lib.select_by_formula("C8H10Xx")
    np.testing.assert_array_equal(lib.select_by_source("b"), np.flatnonzero(lib.source == "b"))
    np.testing.assert_array_equal(lib.select_by_source(["a", "c"]), np.flatnonzero(lib.source != "b"))
    assert lib.select_by_source("zzz").size == 0


def test_formula_index_normalises_library_side():
    lib = CandidateLibrary({"smiles": ["O", "O", "CCO"], "inchikey": ["A-B-N", "C-D-N", "E-F-N"],
                            "formula": ["H2O", "OH2", "C2H6O"], "monoisotopic_mass": [18.0, 18.0, 46.0]})
    assert lib.select_by_formula("H2O").tolist() == [0, 1]


def test_to_tsv_round_trip(tmp_path):
    lib = _quiet(read_library, MOLS / "library.tsv")
    for name in ("out.tsv", "out.tsv.gz"):
        lib.to_tsv(tmp_path / name)
        back = read_library(tmp_path / name)
        assert back.report.n_skipped == 0 and back.columns == lib.columns
        for column in ("smiles", "inchikey", "formula", "name", "id", "source"):
            assert list(back.column(column)) == list(lib.column(column))
        np.testing.assert_allclose(back.monoisotopic_mass, lib.monoisotopic_mass, atol=1e-6)


# -- cache -------------------------------------------------------------------------------------------------

def _write_pool_like(path: Path, n: int, seed: int = 0) -> None:
    lib = _synthetic(n, seed)
    lib.to_tsv(path)


def test_cache_round_trip(tmp_path, monkeypatch):
    import molpredict.chem.candidates as cand

    path = tmp_path / "pool.tsv.gz"
    _write_pool_like(path, 3000)
    fresh = read_library(path, cache=True)
    entry = cache_dir() / f"{file_sha256(path)}-v{LIBRARY_CACHE_FORMAT}"
    assert str(cache_dir()).startswith(str(tmp_path / "home" / "cache"))
    assert (entry / "library.arrow").exists() and (entry / "mass_order.npy").exists()

    monkeypatch.setattr(cand, "_read_tsv", lambda *a, **k: pytest.fail("should come from the cache"))
    cached = read_library(path, cache=True)
    for column in COLUMNS:
        if fresh.has_column(column):
            np.testing.assert_array_equal(cached.column(column), fresh.column(column))
    assert cached.report.n_read == 3000 and cached.path == str(path)
    for q in (100.0, 555.5, 999.0):
        np.testing.assert_array_equal(cached.select_by_mass(q, 30), fresh.select_by_mass(q, 30))
    np.testing.assert_array_equal(cached.select_by_formula("H2O"), fresh.select_by_formula("H2O"))

    # A copy under another name hits the same entry (content key) ...
    copy = tmp_path / "copy.tsv.gz"
    shutil.copy(path, copy)
    assert len(read_library(copy, cache=True)) == 3000
    monkeypatch.undo()
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))
    # ... an edited file does not.
    _write_pool_like(path, 100, seed=5)
    assert len(read_library(path, cache=True)) == 100
    assert len(list(cache_dir().iterdir())) == 2


def test_damaged_cache_entry_is_rebuilt(tmp_path):
    import molpredict.chem.candidates as cand

    path = tmp_path / "pool.tsv"
    _write_pool_like(path, 200)
    read_library(path, cache=True)
    entry = cache_dir() / f"{file_sha256(path)}-v{LIBRARY_CACHE_FORMAT}"
    (entry / "library.arrow").write_bytes(b"truncated")
    lib = read_library(path, cache=True)
    assert len(lib) == 200
    assert len(read_library(path, cache=True)) == 200  # the rebuilt entry reads back


def test_small_files_are_not_cached_by_default(tmp_path):
    read_library(MOLS / "complete.tsv")
    assert not cache_dir().exists() or not any(cache_dir().iterdir())


def test_cache_keeps_skip_report(tmp_path):
    path = tmp_path / "lib.tsv"
    shutil.copy(MOLS / "library.tsv", path)
    first = _quiet(read_library, path, cache=True)
    with pytest.warns(UserWarning, match="3 skipped"):
        second = read_library(path, cache=True)
    assert [str(s) for s in second.report.skipped] == [str(s) for s in first.report.skipped]


# -- candidate sets ----------------------------------------------------------------------------------------

def test_candidate_sets_from_shared_files():
    path = require_shared("candidates", "val_formula.json")
    sets = load_candidate_sets(path)
    assert len(sets) > 100
    for query, entries in list(sets.items())[:500]:
        assert entries[0][0] == query  # the true structure first
        assert all(isinstance(e, tuple) and len(e) == 2 for e in entries)
        assert len(entries) <= 256 and len({e[0] for e in entries}) == len(entries)
    query, entries = next(iter(sets.items()))
    molecules = candidate_set_molecules(entries)
    assert molecules[0].inchikey14 == query and molecules[0]._inchikey is None
    assert Molecule.from_smiles(entries[0][1]).inchikey14 == query


def test_candidate_sets_by_mass_share_formula_masses():
    sets = load_candidate_sets(require_shared("candidates", "test_mass.json"))
    query, entries = max(list(sets.items())[:200], key=lambda kv: len(kv[1]))
    masses = [Molecule.from_smiles(s).monoisotopic_mass for _, s in entries[:20]]
    assert max(abs(m - masses[0]) / masses[0] for m in masses) <= 10.5e-6


def test_bad_candidate_set_files(tmp_path):
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "entry.json").write_text(json.dumps({"AAAAAAAAAAAAAA": [["AAA"]]}))
    (tmp_path / "text.json").write_text("not json")
    for name, expected in [("list.json", "object"), ("entry.json", "record AAAAAAAAAAAAAA"), ("text.json", "JSON")]:
        with pytest.raises(InputError, match=expected):
            load_candidate_sets(tmp_path / name)


# -- the real pool -----------------------------------------------------------------------------------------

def test_real_pool_loads_and_selects():
    path = require_shared("candidates", "pool.tsv.gz")
    start = time.perf_counter()
    lib = read_library(path, cache=False)
    assert time.perf_counter() - start < 60  # a sanity bound, not a benchmark (see benchmarks/load_pool.py)
    assert 1_900_000 < len(lib) < 2_100_000
    assert lib.columns == ["inchikey14", "inchikey", "smiles", "formula", "monoisotopic_mass", "source"]
    hits = lib.select_by_formula("C8H10N4O2")
    caffeine = lib.lookup(["RYYVLZVUVIJVGH"])[0]
    assert caffeine >= 0 and caffeine in hits
    assert all(m.formula == "C8H10N4O2" for m in lib.molecules(hits))
    window = lib.select_by_mass(194.080376, ppm=10)
    assert caffeine in window and set(hits) <= set(window)


# -- CLI ---------------------------------------------------------------------------------------------------

def test_cli_build_and_info(tmp_path):
    from molpredict.cli import cli

    runner = CliRunner()
    out = tmp_path / "lib.tsv"
    result = runner.invoke(cli, ["candidates", "build", str(MOLS / "small.smi"), "-o", str(out), "-j", "1",
                                 "--source", "mine"])
    assert result.exit_code == 0, result.output
    assert "3 of 4" not in result.stdout  # messages go to stderr
    lib = read_library(out)
    assert list(lib.name) == ["caffeine", "ethanol (grain alcohol)", None]
    assert set(lib.source) == {"mine"}
    assert "line 6, field smiles" in result.stderr

    # TSV input: computed columns recomputed, duplicates dropped.
    messy = tmp_path / "messy.tsv"
    messy.write_text("smiles\tinchikey\tname\nOCC\twrong\tfirst\nC(O)C\twrong\tsecond\nc1ccccc1\t\tthird\n")
    out2 = tmp_path / "lib2.tsv.gz"
    result = runner.invoke(cli, ["candidates", "build", str(messy), "-o", str(out2), "--no-progress"])
    assert result.exit_code == 0, result.output
    lib2 = read_library(out2)
    assert list(lib2.smiles) == ["CCO", "c1ccccc1"] and list(lib2.name) == ["first", "third"]
    assert lib2.inchikey[0] == "LFQSCWFLJHTTHZ-UHFFFAOYSA-N"
    assert "1 duplicate" in result.stderr

    result = runner.invoke(cli, ["candidates", "build", str(MOLS / "small.sdf"), "-o", str(tmp_path / "s.tsv")])
    assert result.exit_code == 0 and len(read_library(tmp_path / "s.tsv")) == 2

    result = runner.invoke(cli, ["candidates", "info", str(out), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["rows"] == 3 and info["sources"] == {"mine": 3} and info["distinct_formulas"] == 3
    result = runner.invoke(cli, ["candidates", "info", str(out)])
    assert result.exit_code == 0 and "rows         3" in result.stdout


def test_cli_errors_are_one_line(tmp_path):
    from molpredict.cli import cli

    bad = tmp_path / "x.mgf"
    bad.write_text("BEGIN IONS\nEND IONS\n")
    result = CliRunner().invoke(cli, ["candidates", "info", str(bad)])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "not a candidate library" in result.stderr


def test_one_formula_of_a_set_by_hand_and_the_same_from_a_library_and_from_set_files(tmp_path):
    """``shares_one_formula``: isomers (C2H6O: ethanol, dimethyl ether) share one; adding propanol does not; an
    unparsable SMILES counts as its own. A library source (its formula column) and a set source (SMILES parsed)
    say the same of the same sets."""
    from molpredict.chem.candidates import shares_one_formula
    from molpredict.identification.candidate_sources import LibrarySource, SetSource
    from molpredict.identification.identify import IdentifyOptions

    isomers, mixed = ["CCO", "COC"], ["CCO", "COC", "CCCO"]
    assert shares_one_formula(Molecule(s) for s in isomers)
    assert not shares_one_formula(Molecule(s) for s in mixed)
    assert shares_one_formula([]) and shares_one_formula([Molecule("CCO")])
    assert not shares_one_formula([Molecule("CCO"), Molecule("C1CC")])  # unparsable
    smiles = ["CCO", "COC", "CCCO", "CC(C)O"]
    keys = [Molecule(s).inchikey14 for s in smiles]
    path = tmp_path / "lib.tsv"
    path.write_text("smiles\tname\n" + "".join(f"{s}\tm{i}\n" for i, s in enumerate(smiles)))
    library_source = LibrarySource(read_library(path), IdentifyOptions())
    sets = {"q1": [(keys[0], smiles[0]), (keys[1], smiles[1])],
            "q2": [(keys[0], smiles[0]), (keys[2], smiles[2]), (keys[3], smiles[3])],
            "q3": [(keys[2], smiles[2]), (keys[3], smiles[3])]}
    set_source = SetSource(sets)
    by_key = {k: i for i, k in enumerate(library_source.library.column("inchikey14"))}
    for query, expected in (("q1", True), ("q2", False), ("q3", True)):
        ids = set_source.set_ids(query)
        assert set_source.one_formula(ids) is expected
        assert set_source.one_formula(ids) is expected  # from its memory
        library_ids = np.sort([by_key[k] for k, _ in sets[query]])
        assert library_source.one_formula(library_ids) is expected
        assert library_source.one_formula(library_ids) is expected  # from its memory
