"""``molpredict spectra`` commands: what a spectra file holds."""
from __future__ import annotations

import json
from collections import Counter

import click
import numpy as np

from molpredict.cli.group import cli

__all__ = ["spectra", "spectra_info", "summarize_spectra"]

_TOP = 10
_EXAMPLES = 20  # record numbers listed per skip reason


@cli.group()
def spectra() -> None:
    """Inspect MS/MS spectra files (.mgf, .msp, .mzML, .mzXML, optionally .gz)."""


def summarize_spectra(path: str) -> dict:
    """Counts describing a spectra file, read in one streaming pass (JSON-serialisable).

    Raises
    ------
    InputError
        The file is not a spectra file.
    """
    from molpredict.io import SkipReport, read_spectra, spectra_format
    from molpredict.spectra.cleaning import CleaningPipeline

    cleaning = CleaningPipeline()  # the default cleaning: what `train` and a default model's `identify` apply
    cleaning_skips: Counter = Counter()
    cleaning_examples: dict[str, list[int]] = {}
    report = SkipReport()
    ion_modes: Counter = Counter()
    adducts: Counter = Counter()
    levels: Counter = Counter()
    precisions: Counter = Counter()
    charges: Counter = Counter()
    n_peaks: list[int] = []
    n_smiles = n_inchikey = n_structure = 0
    precursor_min, precursor_max = np.inf, -np.inf
    n_precursor = 0
    for s in read_spectra(path, report=report):
        outcome = cleaning.clean_or_reason(s)
        if isinstance(outcome, str):
            cleaning_skips[outcome] += 1
            examples_of = cleaning_examples.setdefault(outcome, [])
            if len(examples_of) < _EXAMPLES:
                examples_of.append(s.record if s.record is not None else len(n_peaks) + 1)
        n_peaks.append(s.n_peaks)
        ion_modes[s.ion_mode or "unknown"] += 1
        adducts[s.adduct or "(none)"] += 1
        levels[str(s.ms_level)] += 1
        charges["unknown" if s.charge is None else f"{s.charge:+d}"] += 1
        precisions["unknown" if s.mz_precision is None else f"{s.mz_precision:g}"] += 1
        has_smiles = bool(s.metadata.get("smiles"))
        has_inchikey = bool(s.metadata.get("inchikey"))
        n_smiles += has_smiles
        n_inchikey += has_inchikey
        n_structure += has_smiles or has_inchikey or bool(s.metadata.get("inchi"))
        if s.precursor_mz is not None:
            n_precursor += 1
            precursor_min = min(precursor_min, s.precursor_mz)
            precursor_max = max(precursor_max, s.precursor_mz)
    examples: dict[str, list[int]] = {}
    for entry in report:
        records = examples.setdefault(entry.reason, [])
        if len(records) < _EXAMPLES:
            records.append(entry.record)
    peaks = np.asarray(n_peaks, dtype=np.int64)
    peak_stats = ({"min": int(peaks.min()), "median": float(np.median(peaks)), "mean": round(float(peaks.mean()), 2),
                   "max": int(peaks.max()), "total": int(peaks.sum())} if peaks.size else None)
    return {
        "file": str(path),
        "format": spectra_format(path).lstrip("."),
        "spectra": int(peaks.size),
        "skipped": report.count,
        "skipped_by_reason": report.by_reason(),
        "skipped_examples": examples,
        "cleaning_would_skip": dict(cleaning_skips.most_common()),
        "cleaning_examples": cleaning_examples,
        "ion_modes": dict(ion_modes.most_common()),
        "adducts": dict(adducts.most_common()),
        "charges": dict(charges.most_common()),
        "ms_levels": dict(levels.most_common()),
        "with_structure": n_structure,
        "with_smiles": n_smiles,
        "with_inchikey": n_inchikey,
        "with_precursor_mz": n_precursor,
        "precursor_mz_range": [precursor_min, precursor_max] if n_precursor else None,
        "peaks_per_spectrum": peak_stats,
        "mz_precision": dict(precisions.most_common()),
    }


def _counts(counter: dict, top: int = _TOP) -> str:
    items = list(counter.items())
    text = ", ".join(f"{k} {v}" for k, v in items[:top])
    if len(items) > top:
        text += f", ... ({len(items) - top} more, {sum(v for _, v in items[top:])} spectra)"
    return text or "-"


def _reason_lines(counts: dict[str, int], examples: dict[str, list[int]], shown: int = 5) -> list[str]:
    """``  reason: count (records 4, 9, ...)`` per reason."""
    lines = []
    for reason, count in counts.items():
        records = [str(r) for r in examples[reason][:shown]]
        more = ", ..." if count > len(records) else ""
        lines.append(f"  {reason}: {count} (record{'s' if count > 1 else ''} {', '.join(records)}{more})")
    return lines


@spectra.command("info")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def spectra_info(file: str, as_json: bool) -> None:
    """Count the spectra in FILE: ion modes, adducts, structures, peaks, skipped records and why."""
    info = summarize_spectra(file)
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    n = info["spectra"]
    lines = [
        f"file: {info['file']} ({info['format']})",
        f"spectra: {n}",
        f"skipped records: {info['skipped']}",
    ]
    lines += _reason_lines(info["skipped_by_reason"], info["skipped_examples"])
    lines.append(f"cleaning would skip: {sum(info['cleaning_would_skip'].values())} (the default cleaning that "
                 f"training and identification apply)")
    lines += _reason_lines(info["cleaning_would_skip"], info["cleaning_examples"])
    lines += [
        f"ion modes: {_counts(info['ion_modes'])}",
        f"adducts: {_counts(info['adducts'])}",
        f"charges: {_counts(info['charges'])}",
        f"MS levels: {_counts(info['ms_levels'])}",
        f"with structure (SMILES, InChI or InChIKey): {info['with_structure']} of {n}",
    ]
    stats = info["peaks_per_spectrum"]
    if stats:
        lines.append(f"peaks per spectrum: min {stats['min']}, median {stats['median']:g}, mean {stats['mean']:g}, "
                     f"max {stats['max']} ({stats['total']} in all)")
    if info["precursor_mz_range"]:
        lo, hi = info["precursor_mz_range"]
        lines.append(f"precursor m/z: {lo:g} .. {hi:g} ({info['with_precursor_mz']} of {n} spectra)")
    lines.append(f"m/z precision: {_counts(info['mz_precision'])}")
    click.echo("\n".join(lines))
