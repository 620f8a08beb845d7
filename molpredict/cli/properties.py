"""``molpredict properties``: properties of unknown molecules (logP, TPSA, weight...) with intervals, from spectra.

A thin layer over :mod:`molpredict.properties.pipeline`: ``train`` fits one sketched quantile machine per ion
mode (hyperparameters and interval calibration on ``--val``), ``predict`` writes medians and intervals as TSV,
``evaluate`` prints R^2, MAE, pinball, coverage and crossing per property.
"""
from __future__ import annotations

import json
import sys

import click

from molpredict.cli.group import cli
from molpredict.errors import InputError, SpecError

__all__ = ["properties"]


def _levels(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.replace(" ", "").split(",") if v)
    except ValueError:
        raise SpecError(f"--levels {text!r}: expected comma-separated numbers in (0, 1)") from None
    if len(values) < 2 or any(not 0 < v < 1 for v in values) or len(set(values)) != len(values):
        raise SpecError(f"--levels {text!r}: expected at least two distinct levels in (0, 1)")
    return tuple(sorted(values))


def _report_skips(skipped: list, quiet: bool) -> None:
    if skipped and not quiet:
        click.echo(f"molpredict: {len(skipped)} record(s) skipped:", err=True)
        for s in skipped[:20]:
            click.echo(f"  {s}", err=True)
        if len(skipped) > 20:
            click.echo(f"  ... and {len(skipped) - 20} more", err=True)


@cli.group()
def properties() -> None:
    """Predict properties of unknown molecules (logP, TPSA, weight, H-bond donors/acceptors, rotatable bonds,
    rings, aromatic rings, fraction sp3, QED) with intervals from MS/MS spectra."""


@properties.command("train")
@click.argument("train", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--val", "val_path", multiple=True, type=click.Path(dir_okay=False),
              help="Labelled validation spectra (structures disjoint from TRAIN; repeatable): choose lam, "
                   "calibrate the intervals. Without it, 20% of the training structures are held out for that.")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="Model directory to write.")
@click.option("--levels", default="0.1,0.5,0.9", show_default=True, help="Quantile levels, comma-separated.")
@click.option("--lam", default="1e-4,1e-5", show_default=True,
              help="Ridge values, comma-separated (several: chosen on --val).")
@click.option("--kernel", "input_kernel", default=None, help="Input kernel spec (default: the regressor's).")
@click.option("--sketch", default=None, help="Sketch spec, or 'none' for the exact machine (default: the "
                                             "regressor's).")
@click.option("--regressor", default="lipschitz", show_default=True, help="Registered regressor.")
@click.option("--max-train", default=None, type=click.IntRange(min=1),
              help="At most this many training spectra per ion mode.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("-q", "--quiet", is_flag=True, help="No messages on stderr.")
def properties_train(train: tuple[str, ...], val_path: tuple[str, ...], output: str, levels: str, lam: str,
                     input_kernel: str | None, sketch: str | None, regressor: str, max_train: int | None,
                     seed: int, device: str, quiet: bool) -> None:
    """Train a property model on the labelled spectra in TRAIN files (SMILES give the targets; one model per ion
    mode, e.g. TRAIN = train_pos.mgf train_neg.mgf) and write it to -o."""
    from molpredict.properties.model import check_output_dir
    from molpredict.properties.pipeline import train_properties

    check_output_dir(output)  # before the training: an existing folder of other files is never replaced
    try:
        lams = [float(v) for v in lam.split(",") if v.strip()]
    except ValueError:
        lams = []
    if not lams or not all(v >= 0 for v in lams):
        raise click.BadParameter(f"expected numbers >= 0 separated by commas, not {lam!r}", param_hint="--lam")
    params = {"lam": "+".join(f"{v:g}" for v in lams), "seed": seed, "device": device}
    if input_kernel is not None:
        params["input_kernel"] = input_kernel
    if sketch is not None:
        params["sketch"] = sketch
    say = (lambda message: None) if quiet else (lambda message: click.echo(f"molpredict: {message}", err=True))
    bundle, skipped = train_properties(list(train), list(val_path) or None, levels=_levels(levels), regressor=regressor,
                                       params=params, max_train=max_train, seed=seed, log=say)
    _report_skips(skipped, quiet)
    path = bundle.save(output)
    if not quiet:
        for mode, predictor in bundle.predictors.items():
            click.echo(f"molpredict: {mode}: {predictor.n_train_} training spectra, lam "
                       f"{predictor.regressor.lam_:g}, interval offsets "
                       + ", ".join(f"{n} {o:+.3g}" for n, o in zip(predictor.names, predictor.offsets_)), err=True)
        click.echo(f"molpredict: wrote {path}", err=True)


@properties.command("predict")
@click.argument("spectra", type=click.Path(dir_okay=False))
@click.option("--model", "model_path", required=True, type=click.Path(file_okay=False), help="Property model.")
@click.option("-o", "--output", default="-", show_default=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="TSV to write (- for stdout).")
@click.option("-q", "--quiet", is_flag=True, help="No messages on stderr.")
def properties_predict(spectra: str, model_path: str, output: str, quiet: bool) -> None:
    """Write, per spectrum and property, the median and the interval (columns NAME, NAME_low, NAME_high)."""
    from molpredict.atomic import atomic_write
    from molpredict.cli.paths import check_output_files
    from molpredict.properties.model import PropertyBundle
    from molpredict.properties.pipeline import predict_table

    check_output_files({"-o": output}, {"SPECTRA": spectra})
    table, skipped = predict_table(spectra, PropertyBundle.load(model_path))
    _report_skips(skipped, quiet)
    if not len(table):
        raise InputError(f"{spectra}: no spectrum could be predicted ({len(skipped)} skipped)")
    text = table.to_csv(sep="\t", index=False, float_format="%.6g")
    if output == "-":
        sys.stdout.write(text)
    else:
        with atomic_write(output) as handle:  # a failed write leaves no half table under the name
            handle.write(text)
    if not quiet:
        click.echo(f"molpredict: {len(table)} spectra predicted, {len(skipped)} skipped", err=True)


@properties.command("evaluate")
@click.argument("spectra", type=click.Path(dir_okay=False))
@click.option("--model", "model_path", required=True, type=click.Path(file_okay=False), help="Property model.")
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No messages on stderr.")
def properties_evaluate(spectra: str, model_path: str, as_json: bool, quiet: bool) -> None:
    """R^2 and MAE of the median, pinball loss, coverage of the interval and quantile crossing per property,
    on labelled SPECTRA."""
    from molpredict.properties.model import PropertyBundle
    from molpredict.properties.pipeline import evaluate_properties

    result, skipped = evaluate_properties(spectra, PropertyBundle.load(model_path))
    _report_skips(skipped, quiet)
    if as_json:
        # undefined metrics are None (see evaluate_properties): allow_nan=False keeps the output strict JSON
        click.echo(json.dumps(result, indent=2, allow_nan=False))
        return
    columns = [("r2", ".3f"), ("mae", ".4g"), ("pinball", ".4g"), ("coverage", ".3f"), ("crossing", ".4f")]

    def cell(value, spec: str) -> str:
        # "n/a" for an undefined metric (R^2 of constant targets); a value too wide for ``spec`` (R^2 of a
        # nearly constant target can be -1e6) falls back to 3 significant digits, so the columns stay aligned
        if value is None:
            return "n/a"
        text = format(value, spec)
        return text if len(text) <= 9 else format(value, ".3g")

    rows = [[name] + [cell(m[key], spec) for key, spec in columns] for name, m in result["properties"].items()]
    header = ["property"] + [key for key, _ in columns]
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        click.echo(f"{row[0]:<{widths[0]}}" + "".join(f"  {text:>{w}}" for text, w in zip(row[1:], widths[1:])))
    click.echo(f"{result['n_spectra']} spectra")
