"""``molpredict select-sketch-size``: choose DSOKR's output sketch size m_y from the perfect-h curve."""
from __future__ import annotations

import json
import math

import click

from molpredict.errors import InputError, SpecError
from molpredict.cli.group import cli

__all__ = ["select_sketch_size"]


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise SpecError(f"--grid {text!r}: expected comma-separated integers") from None


def _float_list(text: str) -> list[float]:
    """The ridge values of --lams: positive finite numbers (d_eff(lam) of lam <= 0 means nothing)."""
    try:
        values = [float(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise SpecError(f"--lams {text!r}: expected comma-separated numbers") from None
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise SpecError(f"--lams {text!r}: expected positive numbers")
    return values


@cli.command("select-sketch-size")
@click.argument("train", type=click.Path(dir_okay=False))
@click.option("--val", "val_path", required=True, type=click.Path(dir_okay=False),
              help="Validation structures: labelled spectra (MGF/MSP/mzML) or a SMILES / TSV file.")
@click.option("--grid", default="100,200,400,800,1600", show_default=True, help="Sketch sizes m_y to try.")
@click.option("--output-kernel", default="gaussian-tanimoto:gamma=auto", show_default=True,
              help="Output kernel spec.")
@click.option("--sketch", default="subsample", show_default=True,
              help="Output sketch spec without m (subsample, p-sparsified-rademacher, ...).")
@click.option("--candidates", "candidates_path", default=None, type=click.Path(dir_okay=False),
              help="Candidate-set JSON {inchikey14: [[inchikey14, smiles], ...]} (default: rank among the "
                   "validation structures).")
@click.option("--repeats", default=1, show_default=True, type=click.IntRange(min=1),
              help="Sketch draws per size (averaged).")
@click.option("--max-queries", default=1000, show_default=True, type=click.IntRange(min=0),
              help="Use at most this many distinct validation structures (drawn with --seed); 0: all.")
@click.option("--tolerance", default=0.01, show_default=True, type=click.FloatRange(min=0.0, max=1.0),
              help="Plateau rule: the smallest m_y whose hit@1 is within this of the best.")
@click.option("--lams", default="1e-2,1e-3,1e-4,1e-5", show_default=True,
              help="Ridge values for the effective dimension d_eff(lam).")
@click.option("--landmarks", "n_landmarks", default=1000, show_default=True, type=click.IntRange(min=0),
              help="Nystrom landmarks for the effective dimension (0: skip it).")
@click.option("--ion-mode", type=click.Choice(["positive", "negative"]), default=None,
              help="Use only spectra of this ion mode.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="Write the curve as an image (format from the extension: .png, .pdf, .svg, ...).")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False),
              help="Write the curve, d_eff and the recommendation as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress messages on stderr.")
def select_sketch_size(train: str, val_path: str, grid: str, output_kernel: str, sketch: str,
                       candidates_path: str | None, repeats: int, max_queries: int, tolerance: float, lams: str,
                       n_landmarks: int, ion_mode: str | None, seed: int, plot_path: str | None,
                       json_path: str | None, quiet: bool) -> None:
    """Decode the validation structures with the perfect h (g(x) = psi~(y_true)) for each output sketch size
    m_y, estimate the effective dimension of K_y, and recommend the smallest m_y on the plateau (hit@1 within
    --tolerance of the best)."""
    import numpy as np

    from molpredict.cli.paths import check_output_files, check_plot_file
    from molpredict.models.basis import distinct_objects

    check_output_files({"--plot": plot_path, "--json": json_path}, {"TRAIN": train, "--val": val_path})
    check_plot_file(plot_path)  # its format and matplotlib: a failure after the curve would lose it (and --json)
    if not math.isfinite(tolerance):
        raise SpecError(f"--tolerance {tolerance}: expected a number from 0 to 1")
    lam_values = _float_list(lams)  # before any work
    from molpredict.models.sketch_size import effective_dimension, perfect_h_curve, plot_curve, read_structures, recommend

    def say(message: str) -> None:
        if not quiet:
            click.echo(f"molpredict: {message}", err=True)

    sizes = _int_list(grid)
    if not sizes:
        raise SpecError("--grid is empty")
    from molpredict.specs import nested_spec, parse_spec
    if "m" in parse_spec(nested_spec(sketch)).params:  # the grid sets m: a second one would be silently replaced
        raise SpecError(f"--sketch {sketch!r}: give the sketch without m (the sizes come from --grid)")
    train_molecules, skipped = read_structures(train, ion_mode)
    n_distinct = len(distinct_objects(train_molecules)[0])
    say(f"{train}: {len(train_molecules)} structures ({n_distinct} distinct, {skipped} records skipped)")
    beyond = [m for m in sizes if m > n_distinct]
    if beyond:  # a sketch cannot be larger than the structures it samples: those sizes are the exact output side
        import warnings
        warnings.warn(f"--grid {', '.join(map(str, beyond))}: more than the {n_distinct} distinct training "
                      f"structures; measured once, at m_y {n_distinct} (every structure)", UserWarning, stacklevel=1)
    val_molecules, skipped = read_structures(val_path, ion_mode)
    by_key: dict[str, object] = {}
    for molecule in val_molecules:
        by_key.setdefault(molecule.inchikey14, molecule)
    truths = list(by_key.values())
    if not truths:
        raise InputError("no validation structures", path=val_path)
    candidates = None
    if candidates_path:
        from molpredict.chem.candidates import candidate_set_molecules, load_candidate_sets
        sets = load_candidate_sets(candidates_path)
        missing = [t for t in truths if t.inchikey14 not in sets]
        truths = [t for t in truths if t.inchikey14 in sets]
        if not truths:
            raise InputError("no validation structure has a candidate set", path=candidates_path)
        if missing:
            say(f"{len(missing)} validation structures have no candidate set and are left out")
    if max_queries and len(truths) > max_queries:
        keep = np.sort(np.random.default_rng(seed).choice(len(truths), size=max_queries, replace=False))
        truths = [truths[i] for i in keep]
    if candidates_path:
        candidates = [candidate_set_molecules(sets[t.inchikey14]) for t in truths]
        say(f"{len(truths)} queries, {sum(len(c) for c in candidates)} candidates in all")
    else:
        say(f"{len(truths)} queries ranked among the {len(truths)} validation structures")

    rows = perfect_h_curve(train_molecules, truths, sizes, output_kernel, sketch, candidates, repeats, seed,
                           progress=None if quiet else say)
    choice = recommend(rows, tolerance)
    deff = effective_dimension(train_molecules, output_kernel, lam_values, n_landmarks, seed) \
        if n_landmarks > 0 else []

    click.echo(f"{'m_y':>7} {'p_y':>7} {'hit@1':>7} {'hit@5':>7} {'hit@10':>7} {'mrr':>7} {'sec':>7}")
    for row in rows:
        click.echo(f"{row['m_used']:>7} {row['p_y']:>7.0f} {row['hit@1']:>7.3f} {row['hit@5']:>7.3f} "
                   f"{row['hit@10']:>7.3f} {row['mrr']:>7.3f} {row['seconds']:>7.1f}")
    for row in deff:
        click.echo(f"d_eff(lam={row['lam']:g}) = {row['d_eff']:.1f} (n = {row['n']}; "
                   f"m ~ d_eff log d_eff = {row['suggested_m']})")
    click.echo(f"recommended m_y = {choice['m']} (hit@1 {choice['value']:.3f}, best {choice['best']:.3f}, "
               f"tolerance {tolerance:g})")
    if json_path:
        from molpredict.atomic import atomic_write
        with atomic_write(json_path) as handle:
            json.dump({"train": train, "val": val_path, "candidates": candidates_path, "output_kernel": output_kernel,
                       "sketch": sketch, "repeats": repeats, "n_queries": len(truths), "curve": rows,
                       "effective_dimension": deff, "recommendation": choice}, handle, indent=2)
        say(f"wrote {json_path}")
    if plot_path:  # after the JSON: a plot that fails keeps it
        plot_curve(rows, plot_path, choice, title=f"Perfect h ({output_kernel}, {sketch})")
        say(f"wrote {plot_path}")
