"""Choosing the output sketch size m_y of DSOKR: the "perfect h" curve and the effective dimension.

Perfect h
---------
The best any network can do in a sketched basis is to predict the target's own coordinates. Replacing g(x)
by psi~(y_true) and decoding against the candidates (argmax_c psi~(y_true)^T psi~(c)) measures how much the
basis alone loses: with m_y too small, different candidates project onto nearly the same coordinates and the
true structure stops winning. :func:`perfect_h_curve` computes hit@k / MRR of this oracle for a grid of m_y on
validation structures (each distinct structure once: the oracle does not depend on the spectrum).

Rule: :func:`recommend` returns the smallest m_y whose hit@1 is within ``tolerance`` (default 0.01, i.e. one
percentage point) of the best hit@1 on the grid: the start of the plateau.

Effective dimension
-------------------
d_eff(lam) = tr(K (K + n lam I)^-1) = sum_i l_i(lam), the sum of the ridge leverage scores (Alaoui & Mahoney,
2015), is the number of directions of K_y above the noise level lam; a Nystrom sketch needs m of the order of
d_eff log d_eff columns. :func:`effective_dimension` estimates it from a Nystrom approximation of K_y on
``n_landmarks`` uniformly drawn structures (only those rows of K_y are computed): the eigenvalues s_j of the
approximation give d_eff = sum_j s_j / (s_j + n lam).
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from molpredict.errors import SpecError
from molpredict.models.basis import SketchedOutputBasis, distinct_objects
from molpredict.engine.nystrom import Nystrom, create_component
from molpredict.models.dsokr import CandidateSets, candidate_sets, coordinate_metrics
from molpredict.specs import ComponentSpec, nested_spec, parse_spec

__all__ = ["perfect_h_curve", "recommend", "effective_dimension", "plot_curve", "DEFAULT_GRID"]

DEFAULT_GRID = (100, 200, 400, 800, 1600)


def _sketch_spec(sketch: str, m: int, seed: int) -> str:
    spec = parse_spec(nested_spec(sketch))
    params = dict(spec.params)
    params["m"] = int(m)
    params.setdefault("seed", int(seed))
    return str(ComponentSpec(spec.name, params))


def perfect_h_curve(train: Sequence[Any], truths: Sequence[Any], grid: Sequence[int] = DEFAULT_GRID,
                    output_kernel: str = "gaussian-tanimoto:gamma=auto", sketch: str = "subsample",
                    candidates: Any = None, repeats: int = 1, seed: int = 0, ks: Sequence[int] = (1, 5, 10),
                    rel_cutoff: float = 1e-10, progress: Any = None) -> list[dict[str, Any]]:
    """Decoding metrics of the oracle g(x) = psi~(y_true) for each sketch size.

    Parameters
    ----------
    train : sequence of Molecule
        Training structures (duplicates allowed; the basis is built on the distinct ones).
    truths : sequence of Molecule
        Validation structures (one query each; pass distinct ones).
    grid : sequence of int
        Sketch sizes m_y; sizes above the number of distinct training structures n_d are replaced by n_d
        (listed once).
    output_kernel : str
    sketch : str
        Sketch spec without ``m`` (``subsample``, ``p-sparsified-rademacher``...).
    candidates : None, sequence of Molecule, or sequence of sequences
        As in :func:`molpredict.models.dsokr.candidate_sets` (None: rank among the validation structures).
    repeats : int
        Independent sketch draws per size (seeds ``seed``..``seed + repeats - 1``); metrics are averaged.
    progress : callable, optional
        Called with a one-line message after each size.

    Returns
    -------
    list of dict, one per size: ``m`` (requested), ``m_used``, ``p_y`` (mean rank of the basis), ``hit@k``...,
    ``mrr``, ``rank`` (mean rank of the true structure),
    ``hit@1_std`` (over repeats), ``seconds``.
    """
    train = list(train)
    n_distinct = len(distinct_objects(train)[0])
    sizes: list[tuple[int, int]] = []
    for m in sorted({int(m) for m in grid}):
        if m < 1:
            raise SpecError(f"sketch size must be >= 1, got {m}")
        used = min(m, n_distinct)
        if not sizes or sizes[-1][1] != used:
            sizes.append((m, used))
    sets: CandidateSets = candidate_sets(list(truths), candidates)
    kernel = create_component("output_kernel", output_kernel)
    rows = []
    features: dict[str, Any] = {}
    for m, used in sizes:
        start = time.perf_counter()
        runs, ranks = [], []
        for r in range(int(repeats)):
            basis = SketchedOutputBasis(kernel, _sketch_spec(sketch, used, seed + r), rel_cutoff).fit(train)
            if not features:  # every basis fits the kernel on the same outputs: featurise the queries once
                features = {"truths": basis.featurize(list(truths)), "pool": basis.featurize(sets.pool)}
            predictions = basis.coordinates_of_features(features["truths"])
            pool = basis.coordinates_of_features(features["pool"])
            runs.append(coordinate_metrics(predictions, pool, sets, ks=ks))
            ranks.append(basis.rank_)
        row: dict[str, Any] = {"m": m, "m_used": used, "p_y": float(np.mean(ranks))}
        for key in runs[0]:
            row[key] = float(np.mean([run[key] for run in runs]))
        row["hit@1_std"] = float(np.std([run["hit@1"] for run in runs]))
        row["seconds"] = time.perf_counter() - start
        rows.append(row)
        if progress is not None:
            progress(f"m_y={used}: p_y={row['p_y']:.0f} hit@1={row['hit@1']:.3f} mrr={row['mrr']:.3f}")
    return rows


def recommend(rows: Sequence[dict[str, Any]], tolerance: float = 0.01, metric: str = "hit@1") -> dict[str, Any]:
    """The smallest size whose ``metric`` is within ``tolerance`` (absolute) of the best on the curve."""
    if not rows:
        raise SpecError("no sketch sizes to choose from")
    best = max(row[metric] for row in rows)
    for row in sorted(rows, key=lambda r: r["m_used"]):
        if row[metric] >= best - tolerance:
            return {"m": row["m_used"], "metric": metric, "value": row[metric], "best": best,
                    "tolerance": tolerance}
    raise AssertionError("unreachable: the best row is within tolerance of itself")


def effective_dimension(train: Sequence[Any], output_kernel: str = "gaussian-tanimoto:gamma=auto",
                        lams: Sequence[float] = (1e-2, 1e-3, 1e-4, 1e-5), n_landmarks: int = 1000,
                        seed: int = 0) -> list[dict[str, float]]:
    """Nystrom estimates of d_eff(lam) = tr(K_y (K_y + n lam I)^-1) on the distinct training structures.

    Returns
    -------
    list of dict: ``lam``, ``d_eff``, ``suggested_m`` (= ceil(d_eff * max(1, ln d_eff)), the order of columns
    a leverage-score Nystrom sketch needs), ``n`` and ``n_landmarks``.
    """
    distinct = distinct_objects(list(train))[0]
    n = len(distinct)
    nystrom = Nystrom(output_kernel, f"subsample:m={int(n_landmarks)}", seed=seed,
                      kernel_kind="output_kernel").fit(distinct)
    k = len(nystrom.landmarks_)
    features = nystrom.train_features_.T.cpu().numpy()                     # (n, r): K ~= F F^T
    spectrum = np.clip(np.linalg.eigvalsh(features.T @ features), 0.0, None)
    out = []
    for lam in lams:
        d = float(np.sum(spectrum / (spectrum + n * float(lam))))
        out.append({"lam": float(lam), "d_eff": d, "suggested_m": int(np.ceil(d * max(1.0, np.log(max(d, 1.0))))),
                    "n": n, "n_landmarks": k})
    return out


def plot_curve(rows: Sequence[dict[str, Any]], path: str, recommendation: dict[str, Any] | None = None,
               title: str | None = None) -> None:
    """hit@k and MRR of the perfect h against m_y (log scale), with the recommended size marked; a PNG file."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    sizes = [row["m_used"] for row in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key in [k for k in rows[0] if k.startswith("hit@") and not k.endswith("_std")] + ["mrr"]:
        ax.plot(sizes, [row[key] for row in rows], marker="o", label=key)
    if recommendation is not None:
        ax.axvline(recommendation["m"], color="grey", linestyle="--",
                   label=f"recommended m_y = {recommendation['m']}")
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(m) for m in sizes], rotation=45 if len(sizes) > 6 else 0)
    ax.set_xlabel("output sketch size m_y")
    ax.set_ylabel("perfect-h decoding")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title or "Perfect h: decoding with psi~(y_true)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def read_structures(path: str, ion_mode: str | None = None) -> tuple[list[Any], int]:
    """The structures of a labelled file: spectra (MGF/MSP/mzML, their SMILES) or a SMILES / TSV file.

    A TSV (or CSV) with a header naming a ``smiles`` column uses that column (e.g. ChEBI-20's
    ``cid, smiles, description``); any other text file is read as one SMILES per line (first field).

    Returns
    -------
    molecules : list of Molecule, one per record (duplicates kept, in file order)
    n_skipped : int
        Records without a SMILES or whose SMILES RDKit cannot parse.
    """
    from pathlib import Path

    from molpredict.errors import InputError
    from molpredict.chem.molecules import Molecule

    name = Path(path).name.lower().removesuffix(".gz")
    smiles: list[str | None] = []
    if Path(name).suffix in (".mgf", ".msp", ".mzml"):
        from molpredict.io import read_spectra
        for spectrum in read_spectra(path):
            if ion_mode is None or spectrum.ion_mode == ion_mode:
                smiles.append(spectrum.smiles)
    else:
        from molpredict.io.common import open_text
        with open_text(path, "SMILES or TSV") as handle:
            lines = [line.rstrip("\n") for line in handle if line.strip()]
        separator = "\t" if lines and "\t" in lines[0] else ("," if name.endswith(".csv") else None)
        header = [h.strip().lower() for h in (lines[0].split(separator) if lines else [])]
        if "smiles" in header:
            column = header.index("smiles")
            for line in lines[1:]:
                fields = line.split(separator)
                smiles.append(fields[column].strip() if column < len(fields) else None)
        else:
            smiles = [line.split()[0] for line in lines]
    parsed: dict[str, Any] = {}
    out, skipped = [], 0
    for text in smiles:
        if not text:
            skipped += 1
            continue
        if text not in parsed:
            try:
                parsed[text] = Molecule.from_smiles(text)
            except InputError:
                parsed[text] = None
        if parsed[text] is None:
            skipped += 1
        else:
            out.append(parsed[text])
    return out, skipped
