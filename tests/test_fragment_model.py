"""The learnt fragmentation model: features by hand, the likelihood against a naive loop, state round trips."""
from __future__ import annotations

import math

import numpy as np
import pytest

from molpredict.chem.fragment_model import (FEATURE_BINS, FEATURE_NAMES, FragmentModel, _structure_table,
                                            binned_features, fragment_features, ion_features,
                                            peak_log_likelihood, spectra_by_structure)
from molpredict.chem.fragments import HYDROGEN_MASS, fragment_structure, ion_carriers
from molpredict.chem.molecules import Molecule
from molpredict.errors import InputError, ModelFileError, SpecError
from molpredict.spectra.record import Spectrum

from conftest import require_shared

COL = {name: i for i, name in enumerate(FEATURE_NAMES)}


def features_by_atoms(smiles: str) -> dict[frozenset, np.ndarray]:
    fs = fragment_structure(smiles, 2, keep_atoms=True)
    feats = fragment_features(smiles, fs)
    return {frozenset(np.flatnonzero(fs.atoms[i]).tolist()): feats[i] for i in range(fs.n_fragments)}


def check(row: np.ndarray, expected: dict[str, float]) -> None:
    got = {k: float(row[COL[k]]) for k in expected}
    assert got == pytest.approx(expected), got


def test_ethanol_features_by_hand():
    # C0-C1-O2. CH2OH (atoms 1, 2) is cut from CH3 by one single C-C chain bond; its kept end C1 has degree 2 and
    # one heteroatom neighbour (O2); the lost end C0 has degree 1.
    f = features_by_atoms("CCO")
    check(f[frozenset({1, 2})], {
        "bias": 1, "heavy_atoms": 2, "heavy_fraction": 2 / 3, "n_C": 1, "n_H": 3, "n_O": 1, "n_N": 0,
        "dbe": 1 - 3 / 2 + 1, "intact": 0, "depth1": 1, "depth2": 0, "bonds_broken": 1,
        "broken_single-carbon": 1, "broken_single-heteroatom": 0, "broken_ring": 0, "broken_chain": 1,
        "broken_CC": 1, "broken_CO": 0, "hetero_kept": 0, "hetero_lost": 0, "degree_kept": 2, "degree_lost": 1,
        "aromatic_end_kept": 0, "hetero_neighbours_kept": 1, "aromatic_atoms": 0})
    mass = 12.0 + 3 * HYDROGEN_MASS + 15.994914619
    check(f[frozenset({1, 2})], {"mass_100": mass / 100, "mass_fraction": mass / (24 + 6 * HYDROGEN_MASS + 15.994914619)})
    # OH: the C-O bond (single, to a heteroatom); the fragment keeps the heteroatom end.
    check(f[frozenset({2})], {"heavy_atoms": 1, "n_O": 1, "n_H": 1, "bonds_broken": 1, "broken_single-heteroatom": 1,
                              "broken_CO": 1, "hetero_kept": 1, "hetero_lost": 0, "degree_kept": 1, "degree_lost": 2,
                              "hetero_neighbours_kept": 0})
    # CH2 (atom 1 alone) needs both bonds cut: depth 2.
    check(f[frozenset({1})], {"depth2": 1, "bonds_broken": 2, "broken_CC": 1, "broken_CO": 1, "hetero_lost": 1,
                              "degree_kept": 4, "degree_lost": 2, "hetero_neighbours_kept": 2})
    check(f[frozenset({0, 1, 2})], {"intact": 1, "bonds_broken": 0, "heavy_fraction": 1, "mass_fraction": 1})


def test_phenol_aromatic_features_by_hand():
    # c1ccccc1O: atoms 0-5 the ring, 6 the O. The phenyl fragment loses the OH over an aromatic-to-O single bond.
    f = features_by_atoms("c1ccccc1O")
    ring = frozenset(range(6))
    check(f[ring], {"heavy_atoms": 6, "aromatic_atoms": 6, "aromatic_fraction": 1, "ring_atoms_fraction": 1,
                    "n_C": 6, "n_H": 5, "bonds_broken": 1, "broken_single-heteroatom": 1, "broken_chain": 1,
                    "broken_CO": 1, "hetero_lost": 1, "aromatic_end_kept": 1, "aromatic_end_lost": 0,
                    "degree_kept": 3, "degree_lost": 1, "dbe": 6 - 5 / 2 + 1})
    check(f[frozenset({6})], {"aromatic_atoms": 0, "aromatic_end_lost": 1, "aromatic_end_kept": 0, "hetero_kept": 1})
    # A ring opening (two aromatic bonds): C5 (bonded to C4, C0 and O6) keeps its OH when C4-C5 and C5-C0 break;
    # each broken bond counts its ends (C5 twice: degree 3, one heteroatom neighbour).
    check(f[frozenset({5, 6})], {"broken_aromatic": 2, "broken_ring": 2, "broken_chain": 0, "broken_CC": 2,
                                 "aromatic_end_kept": 2, "aromatic_end_lost": 2, "hetero_neighbours_kept": 2,
                                 "degree_kept": 6, "degree_lost": 4, "depth1": 1, "aromatic_fraction": 0.5})


def test_ion_features_layout():
    fs = fragment_structure("CC(=O)O", 2, keep_atoms=True)
    feats = fragment_features("CC(=O)O", fs)
    x = ion_features(feats, 2)
    n_bins = sum(len(e) + 1 for e in FEATURE_BINS.values())
    assert x.shape == (fs.n_fragments * 5, len(FEATURE_NAMES) + 5 + 5 * 7 + n_bins + 5 * n_bins)
    f, s = 2, 3  # fragment 2 with shift +1
    row = x[f * 5 + s]
    np.testing.assert_array_equal(row[:len(FEATURE_NAMES)], feats[f])
    np.testing.assert_array_equal(row[len(FEATURE_NAMES):len(FEATURE_NAMES) + 5], np.eye(5)[s])
    bins = binned_features(feats)
    assert np.all(bins.sum(axis=1) == len(FEATURE_BINS))  # one bin per binned column
    np.testing.assert_array_equal(row[-5 * n_bins:].reshape(5, n_bins)[s], bins[f])
    assert not row[-5 * n_bins:].reshape(5, n_bins)[np.arange(5) != s].any()
    # bin j of a column: edges[j-1] <= x < edges[j]
    edges = FEATURE_BINS["heavy_atoms"]
    heavy = feats[:, COL["heavy_atoms"]]
    offset = sum(len(e) + 1 for name, e in FEATURE_BINS.items() if list(FEATURE_BINS).index(name)
                 < list(FEATURE_BINS).index("heavy_atoms"))
    block = bins[:, offset:offset + len(edges) + 1]
    for v, one_hot in zip(heavy, block):
        j = int(np.argmax(one_hot))
        assert (j == 0 or edges[j - 1] <= v) and (j == len(edges) or v < edges[j])


def naive_log_likelihood(group_mass, group_q, mz, weight, tolerance, shifts, eps, absent_weight):
    total = 0.0
    matched = [False] * len(group_mass)
    for p in range(len(mz)):
        best = 0.0
        for g in range(len(group_mass)):
            for shift in shifts:
                if abs(mz[p] - (group_mass[g] + shift)) <= tolerance[p]:
                    best = max(best, group_q[g])
                    matched[g] = True
        total += weight[p] * math.log(eps + (1 - eps) * best)
    absent = sum(math.log(1 - group_q[g]) for g in range(len(group_mass)) if not matched[g])
    return total + absent_weight * absent


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_likelihood_matches_naive_loop(seed):
    rng = np.random.default_rng(seed)
    group_mass = np.sort(rng.uniform(10, 200, 60))
    group_q = rng.uniform(0, 0.9, 60)
    shifts = np.array([1.007, 22.99])
    # half the peaks sit on an ion (some within tolerance of two), half anywhere
    on = group_mass[rng.choice(60, 15)] + shifts[rng.integers(0, 2, 15)] + rng.normal(0, 0.003, 15)
    mz = np.sort(np.concatenate([on, rng.uniform(10, 220, 15)]))
    weight = rng.uniform(0, 1, 30)
    weight /= weight.sum()
    tolerance = np.full(30, 0.01)
    for eps, absent in ((0.02, 0.0), (0.1, 0.3)):
        got = peak_log_likelihood(group_mass, group_q, mz, weight, tolerance, shifts, eps, absent)
        assert got == pytest.approx(naive_log_likelihood(group_mass, group_q, mz, weight, tolerance, shifts, eps,
                                                         absent), rel=1e-12, abs=1e-12)


def test_vectorised_score_equals_the_per_candidate_likelihood():
    model = constant_model(0.1)
    model.coef_ = np.random.default_rng(0).normal(0, 0.3, model.coef_.shape)  # ions differ in probability
    smiles = ["CC(=O)Nc1ccc(O)cc1", "CC(=O)Nc1ccccc1O", "OC(=O)c1ccccc1O", "CCO", "C"]
    spec = spectrum([43.018, 65.039, 93.034, 110.06, 121.03, 139.04, 152.07], [5, 20, 30, 60, 10, 8, 100],
                    adduct="[M+Na]+", precursor=175.06)
    mz, w, tol = model.peaks(spec)
    shifts = model.carrier_shifts(spec)
    assert shifts.size == 2  # +H and +Na
    expected = [peak_log_likelihood(*model.ion_groups(s), mz, w, tol, shifts, model.eps, model.absent_weight)
                for s in smiles]
    np.testing.assert_allclose(model.score(spec, smiles), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(model.score(spec, smiles[::-1]), expected[::-1], rtol=1e-12, atol=1e-12)
    empty = Spectrum("e", np.zeros(0), np.zeros(0), precursor_mz=175.06, adduct="[M+H]+", ion_mode="positive")
    np.testing.assert_allclose(model.score(empty, smiles),
                               [model.absent_weight * np.log1p(-model.ion_groups(s)[1]).sum() for s in smiles])
    for s in smiles:  # the per-candidate function agrees on a spectrum without peaks
        assert peak_log_likelihood(*model.ion_groups(s), np.zeros(0), np.zeros(0), np.zeros(0), shifts, model.eps,
                                   model.absent_weight) == pytest.approx(model.score(empty, [s])[0], rel=1e-12)


def constant_model(p: float, **params) -> FragmentModel:
    """A model predicting ``p`` for every ion (zero weights, intercept logit(p))."""
    model = FragmentModel(**params)
    n = ion_features(np.zeros((1, len(FEATURE_NAMES))), model.max_h_shift).shape[1]
    model.coef_, model.mean_, model.scale_ = np.zeros(n), np.zeros(n), np.ones(n)
    model.intercept_ = math.log(p / (1 - p))
    return model


def spectrum(mz, intensities, adduct="[M+H]+", precursor=200.0):
    mz, intensities = np.asarray(mz, float), np.asarray(intensities, float)
    order = np.argsort(mz)  # a Spectrum's peaks are sorted by m/z
    return Spectrum("q", mz[order], intensities[order], precursor_mz=precursor, adduct=adduct, ion_mode="positive")


def test_score_matches_naive_reference_on_a_structure():
    # Constant p: a group of k ions of one neutral mass has q = 1 - (1 - p)^k. Naive: every (fragment, shift) ion,
    # grouped by mass by hand, then the naive likelihood.
    p = 0.2
    model = constant_model(p, max_h_shift=1, min_relative_intensity=0.05)
    smiles = "CC(=O)Nc1ccc(O)cc1"
    fs = fragment_structure(smiles, 2)
    masses = [m + h * HYDROGEN_MASS for m in fs.masses for h in (-1, 0, 1)]
    groups: dict[float, int] = {}
    for m in masses:
        groups[round(m, 6)] = groups.get(round(m, 6), 0) + 1
    group_mass = np.array(sorted(groups))
    group_q = np.array([1 - (1 - p) ** groups[m] for m in group_mass])
    proton = ion_carriers("[M+H]+")[0].mass_shift
    mz = [fs.masses[0] + proton, 110.0600, 93.0335, 65.0386, 80.0, 30.0]
    inten = [100.0, 60.0, 30.0, 20.0, 10.0, 2.0]  # the last below 5% of the base peak: not scored
    spec = spectrum(mz, inten, precursor=fs.masses[0] + proton)
    keep = np.array(inten) >= 5.0
    kept_mz = np.array(mz)[keep]
    order = np.argsort(kept_mz)
    w = np.sqrt(np.array(inten)[keep])[order]  # intensity_power 0.5, mz_power 0
    tol = np.maximum(kept_mz[order] * 20e-6, 0.01)
    expected = naive_log_likelihood(group_mass, group_q, kept_mz[order], w / w.sum(), tol, [proton], model.eps,
                                    model.absent_weight)
    assert model.score(spec, [smiles])[0] == pytest.approx(expected, rel=1e-10)
    # an unparsable candidate ranks last, the others are unaffected
    both = model.score(spec, [smiles, "not a smiles"])
    assert both[0] == pytest.approx(expected, rel=1e-10) and both[1] == -np.inf


def test_labels_match_a_naive_loop():
    model = FragmentModel(max_h_shift=1, min_relative_intensity=0.0)
    masses = np.array([50.0, 80.0, 80.004, 120.0, 150.0])
    proton = ion_carriers("[M+H]+")[0].mass_shift
    shown_by_a = spectrum([50.0 + proton, 80.002 + proton], [1.0, 1.0])
    shown_by_b = spectrum([120.0 + proton + 0.02], [1.0])  # outside the 0.01 Da tolerance
    labels = model.labels(masses, [shown_by_a, shown_by_b])
    np.testing.assert_allclose(labels, [0.5, 0.5, 0.5, 0.0, 0.0])


def test_fit_learns_which_ions_show_and_round_trips(tmp_path):
    # Synthetic spectra in which only the intact [M+H]+ and no fragment shows: the model must learn that the
    # intact structure (the `intact` feature) is far more likely than a depth-2 fragment.
    smiles = ["CCO", "CCCO", "CC(C)O", "OCCO", "CCN", "CCCN", "c1ccccc1O", "CC(=O)O"]
    proton = ion_carriers("[M+H]+")[0].mass_shift
    pairs = []
    for s in smiles:
        m = fragment_structure(s, 0).masses[0]
        pairs.append((s, [spectrum([m + proton], [1.0], precursor=m + proton)]))
    model = FragmentModel(seed=0, negative_fraction=1.0).fit(pairs)
    fs = fragment_structure("CCCCO", 2, keep_atoms=True)
    p = model.predict_proba(ion_features(fragment_features("CCCCO", fs), model.max_h_shift))
    intact = p[model.max_h_shift]  # fragment 0, shift 0
    assert intact > 0.5 and intact > 5 * np.median(p)
    # state round trip: npz + JSON, same scores
    spec = spectra_by_structure([pairs[0][1][0]], [Molecule("CCO")])[0][1][0]
    path = model.save(tmp_path / "fm")
    assert sorted(q.name for q in path.iterdir()) == ["fragment_model.json", "fragment_model.npz"]
    loaded = FragmentModel.load(path)
    assert loaded.get_params() == model.get_params()
    np.testing.assert_array_equal(loaded.score(spec, smiles), model.score(spec, smiles))
    npz = path / "fragment_model.npz"
    npz.write_bytes(npz.read_bytes()[: npz.stat().st_size // 2])  # truncated: a bad zip, one line naming it
    with pytest.raises(ModelFileError, match=r"fm: unreadable fragment model \(BadZipFile\)"):
        FragmentModel.load(path)
    arrays, fields = model.state()
    with pytest.raises(ModelFileError):
        FragmentModel.from_state({**arrays, "coef": arrays["coef"][:-1]}, fields)
    with pytest.raises(ModelFileError):
        FragmentModel.from_state(arrays, {**fields, "format": "other"})
    with pytest.raises(SpecError):
        FragmentModel().score(spec, smiles)


def test_fit_refuses_spectra_nothing_explains():
    with pytest.raises(InputError):
        FragmentModel().fit([("CCO", [spectrum([500.0], [1.0], precursor=600.0)])])


def test_spectra_by_structure_groups_and_samples():
    spectra = [spectrum([50.0], [1.0]) for _ in range(5)]
    molecules = [Molecule(s) for s in ("CCO", "OCC", "CCN", "CCO", "CCCC")]  # CCO and OCC are one structure
    groups = spectra_by_structure(spectra, molecules)
    assert sorted(len(g[1]) for g in groups) == [1, 1, 3]
    sample = spectra_by_structure(spectra, molecules, max_structures=2, seed=0)
    assert len(sample) == 2 and sample == spectra_by_structure(spectra, molecules, max_structures=2, seed=0)


def test_bundle_round_trip_keeps_the_fragment_model(tmp_path):
    from molpredict.modelfile import ModelBundle, SubModel
    from molpredict.registry import get_registry

    model = constant_model(0.3)
    baseline = get_registry().create("model", "random").fit([spectrum([47.05], [1.0])], [Molecule("CCO")])
    sub = SubModel(model=baseline, ion_mode="positive", fragments={"max_depth": 2},
                   fragment_model=model)
    path = ModelBundle({"positive": sub}).save(tmp_path / "bundle")
    loaded = ModelBundle.load(path).for_mode("positive")
    assert isinstance(loaded.fragment_model, FragmentModel)
    np.testing.assert_array_equal(loaded.fragment_model.coef_, model.coef_)
    spec = spectrum([47.05, 29.04], [1.0, 0.5])
    np.testing.assert_array_equal(loaded.fragment_model.score(spec, ["CCO", "COC"]), model.score(spec, ["CCO", "COC"]))
    # an older bundle (no fragment model) loads with none
    sub.fragment_model = None
    path = ModelBundle({"positive": sub}).save(tmp_path / "old")
    assert ModelBundle.load(path).for_mode("positive").fragment_model is None
    assert not (path / "positive" / "fragment_model").exists()


@pytest.mark.shared
def test_learnt_model_ranks_the_truth_above_chance_on_real_spectra():
    # Fitted on the spectra of 200 seeded training structures (MassBank train_pos), it ranks the true structure of
    # real validation spectra (48 [M+H]+ ones, selected as in test_fragments) above most of the first 30 candidates of its
    # formula256 set: a mean percentile of 0.5 would be chance.
    from molpredict.chem.candidates import load_candidate_sets
    from molpredict.io import read_spectra

    train = [s for s in read_spectra(require_shared("massbank", "train_pos.mgf")) if s.smiles and s.inchikey]
    first: dict[str, Molecule] = {}
    molecules = [first.setdefault(s.inchikey[:14], Molecule(s.smiles, inchikey14=s.inchikey[:14])) for s in train]
    pairs = spectra_by_structure(train, molecules, max_structures=200, seed=0)
    model = FragmentModel(seed=0).fit(pairs)
    sets = load_candidate_sets(require_shared("candidates", "val_formula256.json"))
    spectra = [s for s in read_spectra(require_shared("massbank", "val_pos.mgf"))
               if s.inchikey and len(sets.get(s.inchikey[:14], ())) >= 30 and s.n_peaks >= 5
               and s.adduct == "[M+H]+" and s.precursor_mz < 500][::25][:48]
    assert len(spectra) == 48
    percentiles = []
    for s in spectra:
        entries = sets[s.inchikey[:14]][:30]
        scores = model.score(s, [smi for _, smi in entries])
        truth = scores[0]
        percentiles.append((np.sum(scores[1:] < truth) + 0.5 * np.sum(scores[1:] == truth)) / (len(scores) - 1))
    assert np.mean(percentiles) > 0.6


def test_identification_fuses_the_fragment_model_through_a_learnt_ranker(tmp_path):
    # A bundle whose fusion is a ranker over the spectrum score, the prior and the fragment model: identification
    # computes the fragment model's term for every candidate and ranks by the ranker's score of the terms (checked
    # by hand from the rows' own spectrum / prior scores and the model's score of each candidate); the bundle
    # (fragment model, ranker) survives a save and load with identical rows.
    from identification_helpers import FAKE_MODEL, SMILES, install_fake_model, synthetic_spectra
    from molpredict.chem.candidates import CandidateLibrary
    from molpredict.identification.calibration import Calibrator
    from molpredict.identification.candidate_sources import LibrarySource
    from molpredict.identification.evidence import WITH_PRIOR, ScoringVariant
    from molpredict.identification.fusion import LearntRanker, ScoreFusion
    from molpredict.identification.identify import Identifier, IdentifyOptions
    from molpredict.modelfile import ModelBundle, SubModel
    from molpredict.spectra.cleaning import CleaningPipeline
    from molpredict.training.pipeline import build_model
    from test_identify import DECOYS, _with_fusion

    install_fake_model()
    spectra, molecules = synthetic_spectra(n_per=3, seed=0)
    fake = build_model(FAKE_MODEL, {"lam": "0.01"}).fit(spectra, molecules)
    base = ModelBundle({"positive": SubModel(model=fake, ion_mode="positive", cleaning=CleaningPipeline().to_dict(),
                                             adducts=["[M+H]+", "[M+Na]+"])})
    fused = _with_fusion(base, DECOYS[:3])
    sub = fused.for_mode("positive")
    model = constant_model(0.2)
    model.coef_ = np.random.default_rng(1).normal(0, 0.3, model.coef_.shape)
    sub.fragment_model = model
    ranker = LearntRanker(("spectrum", "prior", "fragment_model"), ("log_size",), (1.0,), (0.5,), False,
                          np.array([1.0, 0.4, 0.6, 0.2, -0.1, 0.3]))
    sub.scoring = {WITH_PRIOR: ScoringVariant(ScoreFusion({"spectrum": 1.0, "prior": 0.7}, 1.0, ranker=ranker),
                                              Calibrator(coef=[0.8, 0.3, -0.1], intercept=0.2)).to_dict()}
    smiles = SMILES + DECOYS
    library = CandidateLibrary.from_smiles(smiles, names=[f"cand{i}" for i in range(len(smiles))], source="test")
    queries, _ = synthetic_spectra(n_per=1, seed=5)

    def run(b):
        ident = Identifier(b, LibrarySource(library, IdentifyOptions(top_k=100)), IdentifyOptions(top_k=100),
                           cache_root=False)
        return list(ident.run(queries))

    rows = run(fused)
    cleaned = {s.id: CleaningPipeline()(s) for s in queries}
    by_query: dict[str, list] = {}
    for r in rows:
        by_query.setdefault(r["query_id"], []).append(r)
    checked = 0
    for qid, group in by_query.items():
        if len(group) < 2:
            continue
        terms = {"spectrum": np.array([r["spectrum_score"] for r in group]),
                 "prior": np.array([r["prior_score"] for r in group]),
                 "fragment_model": model.score(cleaned[qid], [r["smiles"] for r in group], group[0]["adduct"])}
        expected = ranker.score_flat(terms, np.array([0, len(group)]))
        np.testing.assert_allclose([r["score"] for r in group], expected, rtol=1e-6, atol=1e-9)
        checked += 1
    assert checked >= 3
    path = fused.save(tmp_path / "bundle")
    assert (path / "positive" / "fragment_model" / "fragment_model.npz").is_file()
    again = run(ModelBundle.load(path))
    assert [(r["query_id"], r["smiles"]) for r in again] == [(r["query_id"], r["smiles"]) for r in rows]
    np.testing.assert_allclose([r["score"] for r in again], [r["score"] for r in rows], rtol=1e-9)


def test_validation_fits_the_fusion_with_the_fragment_model_term():
    # fit_submodel_scoring with a fragment model: its term is left to a second pass over the first pass's top
    # candidates (the first pass weighs spectrum and prior only), the report compares the first pass alone with
    # each second-pass size out of fold, and a chosen second pass is stored with the fragment model's term.
    from identification_helpers import FAKE_MODEL, SMILES, install_fake_model, synthetic_spectra
    from molpredict.chem.molecules import Molecule
    from molpredict.modelfile import SubModel
    from molpredict.spectra.cleaning import CleaningPipeline
    from molpredict.training.pipeline import build_model
    from molpredict.training.ranking_validation import fit_submodel_scoring
    from test_identify import DECOYS

    install_fake_model()
    spectra, molecules = synthetic_spectra(n_per=3, seed=0)
    fake = build_model(FAKE_MODEL, {"lam": "0.01"}).fit(spectra, molecules)
    reference = [Molecule.from_smiles(s) for s in DECOYS[:3]]
    sub = SubModel(model=fake, ion_mode="positive", cleaning=CleaningPipeline().to_dict(), adducts=["[M+H]+"],
                   prior=build_model("prior", {}).fit(reference, reference), fragment_model=constant_model(0.2))
    sub.fragment_model.coef_ = np.random.default_rng(2).normal(0, 0.3, sub.fragment_model.coef_.shape)
    val, val_molecules = synthetic_spectra(n_per=2, seed=21)
    sets = {}
    for m in val_molecules:
        same = [Molecule.from_smiles(s) for s in SMILES + DECOYS]
        sets[m.inchikey14] = [(c.inchikey14, c.smiles) for c in same if c.formula == m.formula]
    report = fit_submodel_scoring(sub, val, [sets], metric="mrr", seed=0)
    assert set(sub.scoring["with_prior"]["fusion"]["weights"]) == {"spectrum", "prior"}
    assert set(sub.scoring["without_prior"]["fusion"]["weights"]) == {"spectrum"}
    for variant in ("with_prior", "without_prior"):
        kind = report[variant]["fusion_kind"]
        assert kind in ("weights", "ranker")
        assert ("ranker" in sub.scoring[variant]["fusion"]) == (kind == "ranker")
        choice = report[variant]["rerank_choice"]
        assert set(choice["first_pass"]) == {"mrr", "hit@1", "hit@5", "hit@10"}
        rerank = sub.scoring[variant]["fusion"].get("rerank")
        assert (rerank is not None) == (choice["chosen"] is not None)
        if rerank is not None:
            assert rerank["ranker"]["terms"] == ["first_pass", "fragment_model"]


def test_train_with_fragments_keeps_a_fragment_model_only_when_fused(tmp_path):
    # `train --fragments` with validation candidate sets: the bundle trains, saves and loads; a fragment model is
    # kept exactly when the fitted fusion reads a fragment term, and then survives the round trip.
    import json

    from identification_helpers import FAKE_MODEL, SMILES, install_fake_model, synthetic_spectra
    from molpredict.io import write_mgf
    from molpredict.modelfile import ModelBundle
    from molpredict.training.pipeline import TrainOptions, train_bundle
    from test_identify import DECOYS

    install_fake_model()
    train, train_molecules = synthetic_spectra(n_per=3, seed=0)
    val, val_molecules = synthetic_spectra(n_per=2, seed=2)
    # validation needs structures training has not seen (train refuses shared ones): half of them each
    held = {m.inchikey14 for m in val_molecules[len(val_molecules) // 2:]}
    train = [s for s, m in zip(train, train_molecules) if m.inchikey14 not in held]
    val, val_molecules = map(list, zip(*[(s, m) for s, m in zip(val, val_molecules) if m.inchikey14 in held]))
    write_mgf(train, tmp_path / "train_pos.mgf")
    write_mgf(val, tmp_path / "val_pos.mgf")
    same = [Molecule(s) for s in SMILES + DECOYS]
    sets = {m.inchikey14: [[c.inchikey14, c.smiles] for c in same if c.formula == m.formula] for m in val_molecules}
    (tmp_path / "sets.json").write_text(json.dumps(sets))
    options = TrainOptions(model=FAKE_MODEL, ion_modes=["positive"], fragments=True,
                           val_candidates=[str(tmp_path / "sets.json")], fragment_model_structures=20)
    said: list[str] = []
    bundle, _ = train_bundle([tmp_path / "train_pos.mgf"], options, val_paths=[tmp_path / "val_pos.mgf"],
                             progress=False, log=said.append)
    n_structures = len({s.inchikey[:14] for s in train})
    assert n_structures < 20  # the message counts the structures used, not the option's ceiling
    assert f"fitting the fragmentation model on {n_structures} training structures" in said, said
    sub = bundle.for_mode("positive")
    reads = any(t in ("fragments", "fragment_model")
                for v in sub.scoring.values()
                for t in (v["fusion"].get("rerank", {}).get("ranker", {}).get("terms", [])
                          + (v["fusion"].get("ranker", {}).get("terms", []) or
                             [k for k, w in v["fusion"]["weights"].items() if w])))
    assert reads == (sub.fragments is not None)
    assert sub.fragment_model is None or sub.fragments is not None  # never a fragment model the fusion drops
    # `model info` says what each variant's second pass reads
    described = bundle.describe()["positive"]
    for variant, fitted in sub.scoring.items():
        second = described["scoring"][variant]["second_pass"]
        rerank = fitted["fusion"].get("rerank")
        assert (second is None) == (rerank is None)
        if rerank is not None:
            assert second["k"] == rerank["k"] and second["terms"] == rerank["ranker"]["terms"]
    assert ("fragment_model" in described) == (sub.fragment_model is not None)
    loaded = ModelBundle.load(bundle.save(tmp_path / "bundle")).for_mode("positive")
    assert (loaded.fragment_model is None) == (sub.fragment_model is None)
    if sub.fragment_model is not None:
        np.testing.assert_array_equal(loaded.fragment_model.coef_, sub.fragment_model.coef_)


@pytest.mark.parametrize("max_h_shift", [0, 2])
def test_ion_probabilities_equal_the_model_on_the_full_ion_inputs(max_h_shift):
    # the factored linear score (per fragment + per shift + interactions) is the logistic model on ion_features
    rng = np.random.default_rng(7)
    model = constant_model(0.3, max_h_shift=max_h_shift)
    n = model.coef_.size
    model.coef_ = rng.normal(0, 0.5, n)
    model.mean_ = rng.normal(0, 1, n)
    model.scale_ = rng.uniform(0.5, 2, n)
    for smiles in ("CC(=O)Nc1ccc(O)cc1", "OCC1OC(O)C(O)C(O)C1O", "Clc1ccccc1C(=O)N"):
        fragments, features = _structure_table(smiles, 2)
        np.testing.assert_allclose(model.ion_probabilities(features),
                                   model.predict_proba(ion_features(features, max_h_shift)), rtol=1e-10, atol=1e-13)


def test_second_pass_terms_on_processes_equal_the_terms_in_process(monkeypatch):
    """``add_second_pass_terms`` on 2 processes (whole structures per chunk, fresh scorers, SMILES sent) gives
    exactly the terms of the in-process loop, NaN outside each query's top k."""
    import molpredict.training.ranking_validation as rv
    from molpredict.chem.fragments import FragmentScorer

    proton = ion_carriers("[M+H]+")[0].mass_shift
    smiles = ["CCO", "CCCO", "CC(C)O", "OCCO", "CCN", "CCCN", "c1ccccc1O", "CC(=O)O", "CCCCO", "OCC(O)CO"]
    model = FragmentModel(seed=0, negative_fraction=1.0).fit(
        [(s, [spectrum([fragment_structure(s, 0).masses[0] + proton], [1.0],
                       precursor=fragment_structure(s, 0).masses[0] + proton)]) for s in smiles])
    rng = np.random.default_rng(0)
    queries, molecules, groups, sizes = [], [], [], []
    for q in range(12):  # three spectra of each of four structures; each structure's set is the same
        g = q // 3
        members = [smiles[(g + j) % len(smiles)] for j in range(6)]
        mz = np.sort(rng.uniform(30, 120, 5))
        queries.append((spectrum(mz, rng.uniform(0.1, 1.0, 5), precursor=150.0), None))
        molecules += [Molecule(s) for s in members]
        groups.append(f"s{g}")
        sizes.append(len(members))
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    data = rv.ValidationTerms(offsets, np.zeros(offsets[-1], dtype=bool), {"spectrum": rng.normal(size=offsets[-1])},
                              groups, queries=queries, molecules=molecules)
    scorers = {"fragments": FragmentScorer(), "fragment_model": model}
    serial = rv.add_second_pass_terms(data, scorers, [data.terms["spectrum"]], 4, n_jobs=1)
    monkeypatch.setattr(rv, "PARALLEL_MIN_CANDIDATES", 0)
    messages = []
    parallel = rv.add_second_pass_terms(data, scorers, [data.terms["spectrum"]], 4, log=messages.append, n_jobs=2)
    assert "(2 processes)" in messages[0]
    for name in scorers:
        assert np.isnan(serial.terms[name]).sum() == 12 * 2  # 6 candidates, top 4 scored
        np.testing.assert_array_equal(parallel.terms[name], serial.terms[name])
    chunks = rv._structure_chunks([(np.arange(4),)] * 12, groups, 5)
    assert sum(len(c) for c in chunks) == 12 and all(len(c) % 3 == 0 for c in chunks)  # never splits a structure
