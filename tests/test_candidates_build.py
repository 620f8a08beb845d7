"""`candidates build` and the library readers as a metabolomics user meets them: one row per (structure, source),
isotope-labelled standards under their own formula, salts counted and `--standardize`, the fast and row-by-row
TSV readers skipping the same rows, messages that say what failed, an input with no usable row refused."""
from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from molpredict.chem.candidates import (
    CandidateLibrary,
    LoadReport,
    _read_header,
    _read_tsv_rows,
    dedupe,
    read_library,
)
from molpredict.chem.molecules import Molecule
from molpredict.cli import cli

DIAZEPAM = "CN1C(=O)CN=C(c2ccccc2)c2cc(Cl)ccc21"
DIAZEPAM_13C = "[13CH3]N1C(=O)CN=C(c2ccccc2)c2cc(Cl)ccc21"
DIAZEPAM_D3 = "[2H]C([2H])([2H])N1C(=O)CN=C(c2ccccc2)c2cc(Cl)ccc21"


@pytest.fixture(autouse=True)
def _private_home(tmp_path, monkeypatch):
    """Caches go to a throw-away MOLPREDICT_HOME."""
    monkeypatch.setenv("MOLPREDICT_HOME", str(tmp_path / "home"))


def _quiet(function, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return function(*args, **kwargs)


def _build(*args: str):
    return CliRunner().invoke(cli, ["candidates", "build", *args, "-j", "1", "--no-progress"])


# -- 1. one row per (structure, source) ----------------------------------------------------------------------

def test_dedupe_keeps_one_row_per_structure_and_source():
    library = CandidateLibrary.from_smiles(["CCO", "OCC", "CCO", "c1ccccc1", "CCO", "CCO"],
                                           names=list("abcdef"))
    library = CandidateLibrary({**{c: library.column(c) for c in library.columns},
                                "source": ["x", "x", "y", "x", None, None]})
    report = LoadReport("lib", n_read=6)
    kept = dedupe(library, report)
    # a repeat under the same source goes (b, f); another source keeps its row (c), and no source is one of its own (e)
    assert list(kept.name) == ["a", "c", "d", "e"] and report.n_duplicates == 2
    assert "2 duplicate rows (same InChIKey and source) dropped" in report.summary()


def test_build_of_concatenated_sources_keeps_every_source_label(tmp_path):
    truth = tmp_path / "truth.smi"
    truth.write_text(f"{DIAZEPAM} diazepam\nCCO ethanol\n")
    decoys = tmp_path / "decoys.smi"
    decoys.write_text(f"{DIAZEPAM} diazepam\nc1ccccc1O phenol\nCC(=O)O acetic acid\n")
    assert _build(str(truth), "--source", "massbank", "-o", str(tmp_path / "A.tsv")).exit_code == 0
    assert _build(str(decoys), "--source", "pubchem", "-o", str(tmp_path / "B.tsv")).exit_code == 0
    lines = (tmp_path / "A.tsv").read_text().splitlines() + (tmp_path / "B.tsv").read_text().splitlines()[1:]
    (tmp_path / "AB.tsv").write_text("\n".join(lines) + "\n")
    result = _build(str(tmp_path / "AB.tsv"), "-o", str(tmp_path / "built.tsv"))
    assert result.exit_code == 0, result.output
    library = read_library(tmp_path / "built.tsv")
    assert library.source_counts() == {"pubchem": 3, "massbank": 2}
    diazepam = Molecule.from_smiles(DIAZEPAM).inchikey
    for source in ("massbank", "pubchem"):  # the shared structure is found under either label
        assert diazepam in set(library.inchikey[library.select_by_source(source)])

    info = json.loads(CliRunner().invoke(cli, ["candidates", "info", str(tmp_path / "built.tsv"), "--json"]).stdout)
    assert info["sources"] == {"pubchem": 3, "massbank": 2} and info["multi_source_structures"] == 1
    text = CliRunner().invoke(cli, ["candidates", "info", str(tmp_path / "built.tsv")]).stdout
    assert "1 InChIKeys under several sources" in text

    # Without a source filter, identification ranks the structure once (its first row).
    from molpredict.identification.candidate_sources import LibrarySource

    options = SimpleNamespace(by=None, ppm=10.0, precision_window=True, sources=None)
    source = LibrarySource(library, options)
    ids = library.select_by_formula("C16H13ClN2O")
    assert len(ids) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        once, _ = source.one_per_structure(ids, None)
    assert list(once) == [ids[0]]


# -- 2. isotope-labelled standards ---------------------------------------------------------------------------

def test_labelled_standards_have_their_own_formula_and_are_reached_by_mass_only(tmp_path):
    assert Molecule.from_smiles(DIAZEPAM).formula == "C16H13ClN2O"
    assert Molecule.from_smiles(DIAZEPAM_13C).formula == "C15[13C]H13ClN2O"
    assert Molecule.from_smiles(DIAZEPAM_D3).formula == "C16H10[2H]3ClN2O"
    assert Molecule(DIAZEPAM_13C).formula == "C15[13C]H13ClN2O"  # the lazily computed one too

    library = CandidateLibrary.from_smiles([DIAZEPAM, DIAZEPAM_13C, DIAZEPAM_D3], names=["d", "13C", "d3"])
    assert list(library.name[library.select_by_formula("C16H13ClN2O")]) == ["d"]
    assert list(library.name[library.select_by_mass(285.074996, ppm=5)]) == ["13C"]
    assert list(library.name[library.select_by_mass(284.071641, ppm=5)]) == ["d"]

    # Written and read back through the complete-file reader, the labelled formulas are kept, not skipped; one
    # written as RDKit abbreviates hydrogen isotopes (D) is a formula too.
    library.to_tsv(tmp_path / "iso.tsv")
    text = (tmp_path / "iso.tsv").read_text().replace("C16H10[2H]3ClN2O", "C16H10D3ClN2O")
    (tmp_path / "iso.tsv").write_text(text)
    back = read_library(tmp_path / "iso.tsv")
    assert back.report.n_skipped == 0 and len(back) == 3
    assert list(back.name[back.select_by_formula("C16H13ClN2O")]) == ["d"]


# -- 3. salts and --standardize ------------------------------------------------------------------------------

SALTS = (f"{DIAZEPAM}.Cl diazepam_HCl\n"
         f"{DIAZEPAM}.OC(C(O)C(=O)O)C(=O)O diazepam_tartrate\n"
         "CC(=O)[O-].[Na+] sodium_acetate\n"
         "CC(C)C[C@H]([NH3+])C(=O)NCC(=O)NCC(=O)[O-] LGG_zwitterion\n"
         "c1ccccc1O phenol\n")


def test_salts_are_counted_and_standardize_keeps_the_parent(tmp_path):
    src = tmp_path / "salts.smi"
    src.write_text(SALTS)
    plain = _build(str(src), "-o", str(tmp_path / "plain.tsv"))
    assert plain.exit_code == 0, plain.output
    # the zwitterion has no net charge: its formula is the neutral one
    assert "3 rows are salts or charged forms" in plain.stderr and "--standardize" in plain.stderr
    library = read_library(tmp_path / "plain.tsv")
    assert list(library.formula[:3]) == ["C16H14Cl2N2O", "C20H19ClN2O7", "C2H3NaO2"]  # not standardised by default
    info = CliRunner().invoke(cli, ["candidates", "info", str(tmp_path / "plain.tsv")])
    assert "3 rows are salts or charged forms" in info.stdout
    assert json.loads(CliRunner().invoke(cli, ["candidates", "info", str(tmp_path / "plain.tsv"),
                                               "--json"]).stdout)["salt_or_charged_rows"] == 3

    result = _build(str(src), "-o", str(tmp_path / "parents.tsv"), "--standardize")
    assert result.exit_code == 0, result.output
    assert "--standardize: 4 rows replaced by their parent structure" in result.stderr
    assert "salts or charged" not in result.stderr
    parents = read_library(tmp_path / "parents.tsv")
    # the two diazepam salts become one diazepam row (a repeat of the same source)
    assert list(parents.name) == ["diazepam_HCl", "sodium_acetate", "LGG_zwitterion", "phenol"]
    assert list(parents.formula) == ["C16H13ClN2O", "C2H4O2", "C10H19N3O4", "C6H6O"]
    assert parents.monoisotopic_mass[0] == pytest.approx(284.071641, abs=1e-6)
    assert parents.smiles[0] == Molecule.from_smiles(DIAZEPAM).smiles
    assert "1 duplicate rows" in result.stderr


# -- 4. the fast reader and the row reader agree ---------------------------------------------------------------

def test_fast_and_row_readers_skip_the_same_rows(tmp_path):
    complete = CandidateLibrary.from_smiles(["CCO", "c1ccccc1O", "CC(=O)O", "CCN", DIAZEPAM_13C])
    complete.to_tsv(tmp_path / "complete.tsv")
    lines = (tmp_path / "complete.tsv").read_text().splitlines()
    lines[2] = lines[2].replace("94.041865", "-94.041865")  # a negative mass
    lines[4] = lines[4].replace("C2H7N", "not_a_formula")
    (tmp_path / "bad.tsv").write_text("\n".join(lines) + "\n")

    fast = _quiet(read_library, tmp_path / "bad.tsv", cache=False)
    rows = _read_tsv_rows(tmp_path / "bad.tsv", _read_header(tmp_path / "bad.tsv"))
    expected = [(3, "monoisotopic_mass"), (5, "formula")]
    for library in (fast, rows):
        assert [(s.line, s.field) for s in library.report.skipped] == expected
        assert len(library) == 3 and float(np.min(library.monoisotopic_mass)) > 0
        assert library.formula[-1] == "C15[13C]H13ClN2O"
    assert str(fast.report.skipped[1]).endswith("bad.tsv, line 5, field formula: not a formula: 'not_a_formula'")

    # An incomplete row sends the file through the row reader: the same rows are skipped, and the new one kept.
    (tmp_path / "mixed.tsv").write_text("\n".join(lines + ["\t".join(["", "", "CCCC", "", ""])]) + "\n")
    mixed = _quiet(read_library, tmp_path / "mixed.tsv", cache=False)
    assert [(s.line, s.field) for s in mixed.report.skipped] == expected and len(mixed) == 4


# -- 5. messages ---------------------------------------------------------------------------------------------

def test_messages_say_what_failed(tmp_path):
    peg = "O" + "CCO" * 400  # 1,201 atoms: RDKit parses it, InChI refuses it
    library = _quiet(CandidateLibrary.from_smiles, [peg, "CCO"])
    reason = library.report.skipped[0].reason
    assert reason.startswith("no InChIKey: InChI fails on this structure (1201 heavy atoms)")
    assert "cannot parse" not in reason

    ethanol = "\n     RDKit          2D\n\n  3  2  0  0  0  0  0  0  0  0999 V2000\n" + \
        "".join(f"    {x:.4f}    0.0000    0.0000 {e}   0  0  0  0  0  0  0  0  0  0  0  0\n"
                for x, e in ((0, "C"), (1.5, "C"), (3.0, "O"))) + \
        "  1  2  1  0\n  2  3  1  0\nM  END\n$$$$\n"
    empty = "\n     RDKit          2D\n\n  0  0  0  0  0  0  0  0  0  0999 V2000\nM  END\n$$$$\n"
    (tmp_path / "lib.sdf").write_text("ethanol" + ethanol + "nothing" + empty)
    sdf = _quiet(read_library, tmp_path / "lib.sdf")
    assert len(sdf) == 1 and [(s.line, s.field) for s in sdf.report.skipped] == [(12, "molblock")]
    assert sdf.report.skipped[0].reason == "empty SDF record (no atoms)"

    # A row whose SMILES cell is empty is read from its InChI; a row with neither says so.
    (tmp_path / "inchi.tsv").write_text("smiles\tinchi\tname\n\tInChI=1S/CH4/h1H4\tmethane\n"
                                        "\tInChI=1S/garbage\tbad\n\t\tnone\nCCO\t\tethanol\n")
    inchi = _quiet(read_library, tmp_path / "inchi.tsv")
    assert list(inchi.smiles) == ["C", "CCO"] and list(inchi.formula) == ["CH4", "C2H6O"]
    assert [(s.line, s.field) for s in inchi.report.skipped] == [(3, "inchi"), (4, "smiles")]
    assert "RDKit cannot parse InChI" in inchi.report.skipped[0].reason


# -- 6. nothing usable ---------------------------------------------------------------------------------------

def test_build_refuses_an_input_with_no_usable_row(tmp_path):
    src = tmp_path / "allbad.tsv"
    src.write_text("smiles\tname\n\tx\nC1CC(\ty\n")
    out = tmp_path / "out.tsv"
    result = _build(str(src), "-o", str(out))
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and "no usable structure" in result.stderr
    assert "allbad.tsv" in result.stderr and "line 2, field smiles" in result.stderr
    assert not out.exists()
