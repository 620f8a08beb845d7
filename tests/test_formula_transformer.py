"""The peak-formula set encoder (``formula-transformer``): tokens against hand-annotated peaks, a network that
ignores token order and padding, and DSOKR with it: bundle round trip and determinism."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from molpredict.chem.molecules import ELECTRON_MASS, Molecule
from molpredict.engine.formula_transformer import (_N_ELEM, ELEMENTS, FormulaTransformerEncoder, PeakTokens,
                                                   _columns, collision_energy, peak_tokens)
from molpredict.spectra import Spectrum

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# slot-relative offsets (the module's layout: present, error / tolerance, error ppm / 10, RDBE fragment, RDBE loss,
# fragment counts, loss counts)
PRESENT, ERR_TOL, RDBE_F, RDBE_L, FRAG, LOSS = 0, 1, 3, 4, 5, 5 + _N_ELEM


def _vector(**counts):
    out = np.zeros(_N_ELEM)
    for element, n in counts.items():
        out[ELEMENTS.index(element)] = n / 10.0
    return out


def _spectrum(mz, intensities, formula="CH4N2O", adduct="[M+H]+", ce="20 eV", precursor=61.0396):
    return Spectrum("s", np.asarray(mz, dtype=float), np.asarray(intensities, dtype=float), precursor_mz=precursor,
                    charge=1, ion_mode="positive", adduct=adduct,
                    metadata={"formula": formula, "collision_energy": ce} if formula else {"collision_energy": ce})


# Urea, [M+H]+: the ion is CH5N2O+. By hand (C 12, H 1.007825, N 14.003074, O 15.994915):
#  - a peak whose neutral mass is 28.0065 (m/z 28.0065 - electron) is explained within 0.02 Da by N2 (28.006148,
#    error -0.000352), CO (27.994915, -0.011585) and CH2N (28.018724, +0.012224), closest first; the losses
#    are CH5O, H5N2 and H3NO;
#  - m/z 44.0131 is CH2NO+ (44.013639 - electron: error 0), loss H3N, then N2O (44.001063, error -0.012576),
#    loss CH5; CH4N2 (44.037448) is 0.0238 away, outside the tolerance;
#  - m/z 50.5 has no sub-formula within 0.02 Da.
UREA_PEAKS = ([28.0065 - ELECTRON_MASS, 44.013639 - ELECTRON_MASS, 50.5], [100.0, 50.0, 25.0])


def test_tokens_match_hand_annotated_peaks():
    spectrum = _spectrum(*UREA_PEAKS)
    cols = _columns(3)
    tok = peak_tokens([spectrum], explanations=3, mz_tolerance=0.02, ppm=1.0)
    assert tok.offsets.tolist() == [0, 4] and tok.tokens.shape == (4, cols["width"])
    prec, p28, p44, p50 = tok.tokens  # precursor first, then by decreasing intensity
    s = [cols[f"slot{i}"][0] for i in range(3)]
    # precursor: the ion formula CH5N2O, [M+H]+, 20 eV
    assert prec[cols["precursor"]] == 1 and prec[cols["explained"]] == 0 and prec[cols["unexplained"]] == 0
    np.testing.assert_allclose(prec[s[0] + FRAG: s[0] + FRAG + _N_ELEM], _vector(C=1, H=5, N=2, O=1), atol=1e-6)
    np.testing.assert_allclose(prec[s[0] + RDBE_F], (1 + 1 - 2.5 + 1) / 10, atol=1e-6)
    a0 = cols["adduct"][0]
    assert prec[a0] == 1 and prec[a0 + 1:cols["adduct"][1]].sum() == 0  # [M+H]+ is the first adduct column
    assert prec[cols["ce"]] == pytest.approx(0.2) and prec[cols["ce_known"]] == 1 and prec[cols["ce_normalized"]] == 0
    assert prec[cols["mz"]] == pytest.approx(0.0610396) and prec[cols["ion_mode"]] == 1
    # m/z 28: N2, CO, CH2N in that order, with their losses and signed errors in tolerance units
    expected = [(dict(N=2), dict(C=1, H=5, O=1), -0.000352), (dict(C=1, O=1), dict(H=5, N=2), -0.011585),
                (dict(C=1, H=2, N=1), dict(H=3, N=1, O=1), 0.012224)]
    assert p28[cols["explained"]] == 1 and p28[cols["unexplained"]] == 0
    for base, (frag, loss, error) in zip(s, expected):
        assert p28[base + PRESENT] == 1
        np.testing.assert_allclose(p28[base + FRAG: base + FRAG + _N_ELEM], _vector(**frag), atol=1e-6)
        np.testing.assert_allclose(p28[base + LOSS: base + LOSS + _N_ELEM], _vector(**loss), atol=1e-6)
        assert p28[base + ERR_TOL] == pytest.approx(error / 0.02, abs=1e-4)
    assert p28[s[0] + RDBE_F] == pytest.approx(0.2) and p28[s[2] + RDBE_F] == pytest.approx(0.15)
    assert p28[cols["intensity"]] == 1 and p28[cols["mz"]] == pytest.approx(0.0280059, abs=1e-7)
    assert p28[cols["loss_mz"]] == pytest.approx((61.0396 - 28.0059505) / 1000, abs=1e-7)
    # m/z 44: CH2NO (loss NH3), then N2O (loss CH5); the third slot empty
    np.testing.assert_allclose(p44[s[0] + FRAG: s[0] + FRAG + _N_ELEM], _vector(C=1, H=2, N=1, O=1), atol=1e-6)
    np.testing.assert_allclose(p44[s[0] + LOSS: s[0] + LOSS + _N_ELEM], _vector(H=3, N=1), atol=1e-6)
    assert p44[s[0] + ERR_TOL] == pytest.approx(0.0, abs=1e-4)
    np.testing.assert_allclose(p44[s[1] + FRAG: s[1] + FRAG + _N_ELEM], _vector(N=2, O=1), atol=1e-6)
    np.testing.assert_allclose(p44[s[1] + LOSS: s[1] + LOSS + _N_ELEM], _vector(C=1, H=5), atol=1e-6)
    assert p44[s[1] + ERR_TOL] == pytest.approx(-0.012576 / 0.02, abs=1e-4)
    assert not p44[s[2]:].any()
    assert p44[cols["intensity"]] == pytest.approx(0.5) and p44[cols["sqrt_intensity"]] == pytest.approx(0.5 ** 0.5)
    # m/z 50.5: the "no formula" token
    assert p50[cols["unexplained"]] == 1 and p50[cols["explained"]] == 0 and not p50[s[0]:].any()
    assert p50[cols["has_formula"]] == 1


def test_spectrum_without_formula_has_only_no_formula_tokens():
    tok = peak_tokens([_spectrum(*UREA_PEAKS, formula=None, adduct="[M+Na]+", ce=None)], mz_tolerance=0.02)
    cols = _columns(3)
    prec, peaks = tok.tokens[0], tok.tokens[1:]
    assert prec[cols["has_formula"]] == 0 and not prec[cols["slot0"][0]:].any()
    assert prec[cols["adduct"][0] + 1] == 1 and prec[cols["ce_known"]] == 0
    assert (peaks[:, cols["unexplained"]] == 1).all() and not peaks[:, cols["slot0"][0]:].any()


def test_max_peaks_keeps_the_most_intense():
    mz = np.arange(10, 60, dtype=float) + 0.5
    tok = peak_tokens([_spectrum(mz, np.arange(50, dtype=float) + 1)], max_peaks=5)
    cols = _columns(3)
    np.testing.assert_allclose(tok.tokens[1:, cols["mz"]], (mz[::-1][:5]) / 1000, rtol=1e-6)


@pytest.mark.parametrize("text,value", [("20", (20.0, False)), ("30 eV", (30.0, False)),
                                        ("35 % (nominal)", (35.0, True)), ("20(NCE)", (20.0, True)),
                                        ("10-40 eV", (25.0, False)), ("ramp", None), (None, None)])
def test_collision_energy(text, value):
    assert collision_energy(text) == value


def _random_network(seed=0, out_dim=7):
    torch.manual_seed(seed)
    encoder = FormulaTransformerEncoder(d_model=16, nhead=2, layers=2, dim_feedforward=32).fit([])
    net = encoder.build(out_dim)
    torch.nn.init.normal_(net.head.weight)  # the head starts at zero: outputs would be 0 whatever the tokens
    torch.nn.init.normal_(net.head.bias)
    return encoder, net.eval()


def _random_tokens(rng, lengths, width):
    tokens = rng.normal(size=(sum(lengths), width)).astype(np.float32)
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    tokens[:, 0] = 0.0
    tokens[offsets[:-1], 0] = 1.0  # the precursor column
    return PeakTokens(offsets, tokens)


def test_pooled_output_ignores_token_order():
    encoder, net = _random_network()
    rng = np.random.default_rng(0)
    tok = _random_tokens(rng, [6, 9], _columns(3)["width"])
    shuffled = PeakTokens(tok.offsets, tok.tokens.copy())
    for a, b in zip(tok.offsets[:-1], tok.offsets[1:]):
        shuffled.tokens[a:b] = tok.tokens[a:b][rng.permutation(b - a)]  # the precursor token moves too
    with torch.no_grad():
        before = net(encoder.to_tensor(tok, torch.device("cpu")))
        after = net(encoder.to_tensor(shuffled, torch.device("cpu")))
    assert before.abs().max() > 0.1 and not torch.allclose(before[0], before[1])
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)


def test_padding_changes_nothing():
    encoder, net = _random_network(1)
    rng = np.random.default_rng(1)
    tok = _random_tokens(rng, [3, 12], _columns(3)["width"])
    device = torch.device("cpu")
    with torch.no_grad():
        together = net(encoder.to_tensor(tok, device))
        alone = net(encoder.to_tensor(tok.take(np.array([0])), device))
        x, pad = encoder.to_tensor(tok, device)
        x[pad] = 1e3  # whatever the padding holds
        garbage = net((x, pad))
    assert pad[0].sum() == 9 and not pad[1].any()
    torch.testing.assert_close(alone[0], together[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(garbage, together, atol=1e-5, rtol=1e-5)


# -- DSOKR with the encoder ----------------------------------------------------------------------------------------
SMILES = ["CCO", "CC(=O)O", "c1ccccc1O", "CCN", "OCC(O)CO", "CC(C)O", "NCC(=O)O", "c1ccncc1", "CCCCO", "OC(=O)CCC(=O)O"]


def _labelled(n, seed):
    rng = np.random.default_rng(seed)
    molecules = [Molecule.from_smiles(SMILES[i % len(SMILES)]) for i in range(n)]
    spectra = []
    for i, molecule in enumerate(molecules):
        mass = molecule.monoisotopic_mass + 1.007276
        mz = np.sort(rng.uniform(10, mass - 1, size=rng.integers(2, 9)))
        spectra.append(Spectrum(f"s{i}", mz, rng.uniform(1, 100, size=mz.size), precursor_mz=mass, charge=1,
                                ion_mode="positive", adduct="[M+H]+",
                                metadata={"formula": molecule.formula, "collision_energy": "30"}))
    return spectra, molecules


def _dsokr(**kw):
    from molpredict.models.dsokr import DSOKR
    params = dict(encoder="formula-transformer:d_model=16;nhead=2;layers=1;dim_feedforward=32",
                  output_sketch="subsample:m=8", epochs=2, batch_size=8, device="cpu", seed=3)
    params.update(kw)
    return DSOKR(**params)


def saved_and_loaded(model, tmp_path):
    """``model`` (a DSOKR) written as a bundle writes it (safetensors + JSON), then read back."""
    from safetensors.numpy import load_file, save_file

    from molpredict.models.dsokr import DSOKR
    arrays, metadata = model.get_state()
    save_file(arrays, str(tmp_path / "m.safetensors"))
    (tmp_path / "m.json").write_text(json.dumps(metadata))
    return DSOKR.from_state(load_file(str(tmp_path / "m.safetensors")), json.loads((tmp_path / "m.json").read_text()))


def test_dsokr_bundle_round_trip_scores_identically(tmp_path):
    x, y = _labelled(40, 0)
    model = _dsokr().fit(x, y)
    again = saved_and_loaded(model, tmp_path)
    scores = model.score(x[:6], y[:10])
    assert np.abs(scores).max() > 0  # trained: not the zero network
    np.testing.assert_array_equal(again.score(x[:6], y[:10]), scores)


def test_dsokr_training_is_deterministic_on_cpu():
    x, y = _labelled(40, 1)
    a = _dsokr(seed=5).fit(x, y).predict_coordinates(x[:5])
    b = _dsokr(seed=5).fit(x, y).predict_coordinates(x[:5])
    c = _dsokr(seed=6).fit(x, y).predict_coordinates(x[:5])
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


@pytest.mark.cuda
def test_cuda_training_reloads_on_cpu():
    from molpredict.models.dsokr import DSOKR
    x, y = _labelled(40, 2)
    model = _dsokr(device="cuda").fit(x, y)
    arrays, metadata = model.get_state()
    metadata["params"]["device"] = "cpu"
    again = DSOKR.from_state(arrays, metadata)
    np.testing.assert_allclose(again.score(x[:6], y), model.score(x[:6], y), atol=1e-4)


def test_explain_masses_parts_give_the_element_counts():
    from molpredict.chem.formulas import explain_masses, subformula_table
    table = subformula_table({"C": 1, "H": 5, "N": 2, "O": 1})
    peak, key, error, ch, het = explain_masses(table, np.array([28.0065]), np.array([0.02]), parts=True)
    found = sorted(zip(np.abs(error).round(6).tolist(), [tuple(sorted(c.items())) for c in table.counts(ch, het)]))
    assert found == [(0.000352, (("N", 2),)), (0.011585, (("C", 1), ("O", 1))),
                     (0.012224, (("C", 1), ("H", 2), ("N", 1)))]  # by hand, see UREA_PEAKS
    assert explain_masses(table, np.array([28.0065]), np.array([0.02]))[0].tolist() == peak.tolist()
