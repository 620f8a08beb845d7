"""The training pipeline: read labelled spectra, filter, label with structures, clean, fit one model per ion mode,
and describe what happened (counts per skip reason, distinct structures, timings, chosen parameters).

Labels come from each spectrum's ``SMILES`` (else ``INCHI``) metadata. A spectrum is skipped, and counted under
its reason, when it has no ion mode, an ion mode not asked for, an excluded licence, no parseable structure, or
no peaks after cleaning. Records the reader could not parse are counted too (the reader's skip report).
"""
from __future__ import annotations

import inspect
import math
import re
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from molpredict.errors import InputError, SpecError
from molpredict.modelfile import ION_MODES, ModelBundle, SubModel, file_sha256, json_ready
from molpredict.specs import Grid, is_no_sketch, nested_spec, parse_spec
from molpredict.spectra.record import spectrum_ion_mode

__all__ = ["TrainOptions", "DEFAULT_MODEL", "LabelledSet", "load_labelled", "train_bundle", "train_text_bundle",
           "model_defaults", "license_excluded", "build_model", "format_summary", "check_train_options",
           "MIN_STRUCTURES"]

#: the model ``molpredict train`` fits when none is named; every other default is the model's own
#: (its constructor's for spectra, :meth:`Model.train_defaults` for text)
DEFAULT_MODEL = "sisokr"
#: the options that name a model parameter of the same name
MODEL_OPTIONS = ("input_kernel", "output_kernel", "input_sketch", "output_sketch", "lam")
#: fewer distinct training structures than this in a mode is warned about: the model predicts in the span of the
#: training structures' fingerprints (fewer than 10 directions), and without --val the grid is chosen on
#: round(10%) of them, a single structure
MIN_STRUCTURES = 10


def model_defaults(model_spec: str, input_type: str = "spectrum", n_inputs: int = 0, n_structures: int = 0,
                   registry: Any = None) -> dict[str, Any]:
    """The parameters a model fitted by ``molpredict train`` gets where the user sets none: the constructor's
    defaults updated with :meth:`~molpredict.models.base.Model.train_defaults` (which may depend on the input
    type and the data size). Parameters given in ``model_spec`` itself are not included."""
    if registry is None:
        from molpredict.registry import get_registry
        registry = get_registry()
    cls = registry.get("model", parse_spec(model_spec).name)
    params = {p.name: p.default for p in inspect.signature(cls.__init__).parameters.values()
              if p.name in cls.param_names() and p.default is not inspect.Parameter.empty}
    train_defaults = getattr(cls, "train_defaults", None)
    if train_defaults is not None:
        params.update(train_defaults(input_type, n_inputs, n_structures))
    return params


@dataclass
class TrainOptions:
    """What ``molpredict train`` was asked (None: the model's or molpredict's default).

    Attributes
    ----------
    model : str
        Registry name of the model, optionally with parameters (``sisokr:foo=1``).
    input_kernel, output_kernel, input_sketch, output_sketch : str or None
        Component specs (grids allowed where the model searches them).
    lam : str or float or None
        Ridge parameter or a grid ``"a|b|c"``.
    ion_modes : sequence of str or None
        Modes to train (None: those present in the training data).
    exclude_licenses : sequence of str
        Drop records whose licence contains one of these tokens (``NC`` drops CC BY-NC, CC BY-NC-SA...).
    device : str
    seed : int
    cleaning : dict or None
        ``CleaningPipeline`` settings (None: its defaults).
    select_by : {"mrr", "hit@K", "kernel-loss"} or None
        None: the model's default (``mrr`` for the IOKR family). How grid points and the score fusion are
        chosen on validation data: a ranking metric of the true structures in validation candidate sets (needs ``val_candidates`` or ``library``; otherwise the kernel
        loss is used), or the kernel loss.
    val_candidates : path, sequence of paths, or None
        MassSpecGym-style candidate sets for the validation structures (e.g. ``val_formula256.json``). With
        several files every validation spectrum ranks once per file, so the selection and the fusion weights
        serve every kind of candidate set given (hard padded sets and real library sets weigh the prior
        differently: fitted on both, the fusion costs little on either).
    calibration_candidates : path, sequence of paths, or None
        More candidate sets of the validation structures (e.g. ``val_mass.json``, mass-window sets) that the
        calibration of the probability is fitted on, but not the selection or the fusion: the probability is then
        calibrated on every kind of set it is used on (:func:`~molpredict.training.ranking_validation.fit_scoring`).
    library : path or None
        A candidate library: without ``val_candidates``, same-formula sets for the validation structures are
        drawn from it (at most 256 each, the truth included); default: the configured default library
        (``molpredict config set library``), if any.
    prior : str
        The structure prior fused with the spectrum score: ``train`` (similarity to the training structures),
        ``none``, or a candidate library / SMILES file whose structures are the reference set.
    fragments : bool
        Also fit the learnt fragmentation model (:mod:`molpredict.chem.fragment_model`) on the training spectra and
        read each candidate against the query's peaks with it and with the MetFrag-style fragment score
        (:mod:`molpredict.chem.fragments`), in a second pass that re-ranks the fused ranking's top 16 or 32 (chosen
        on validation; :class:`~molpredict.identification.fusion.Rerank`): only those candidates are fragmented.
        Both stay out when validation ranks no better with them (and without validation sets). On by default:
        on val_pos the second pass adds 2.2 points of hit@1 out of fold (formula256 and formula sets), for about
        3 minutes more training of train_pos on 2 cores (519 s in all, 348 s without).
    fragment_model_structures : int
        Training structures (a seeded sample) the fragmentation model is fitted on.
    """

    model: str = DEFAULT_MODEL
    input_kernel: str | None = None
    output_kernel: str | None = None
    input_sketch: str | None = None
    output_sketch: str | None = None
    lam: Any = None
    ion_modes: Sequence[str] | None = None
    exclude_licenses: Sequence[str] = ()
    device: str = "auto"
    seed: int = 0
    cleaning: dict | None = None
    extra_params: dict[str, Any] = field(default_factory=dict)
    select_by: str | None = None
    val_candidates: str | Sequence[str] | None = None
    calibration_candidates: str | Sequence[str] | None = None
    library: str | None = None
    prior: str = "train"
    fragments: bool = True
    fragment_model_structures: int = 1000

    def component_params(self, input_type: str = "spectrum", n_inputs: int = 0, n_structures: int = 0,
                         registry: Any = None) -> dict[str, Any]:
        """Parameters passed to the model: the user's choices, else the model's defaults for this kind of
        training data (:func:`model_defaults`); :func:`build_model` uses only those the model accepts."""
        params = model_defaults(self.model, input_type, n_inputs, n_structures, registry)
        for name in MODEL_OPTIONS:
            value = getattr(self, name)
            if value is not None:
                params[name] = value
        params["device"] = self.device
        params["seed"] = self.seed
        if self.select_by is not None:
            params["select_by"] = self.select_by
        params.update(self.extra_params)
        return params

    def filters(self) -> dict[str, Any]:
        return {"ion_modes": list(self.ion_modes) if self.ion_modes else None,
                "exclude_licenses": list(self.exclude_licenses), "cleaning": self.cleaning}


def license_excluded(license_text: str | None, excluded: Sequence[str]) -> bool:
    """Whether a licence string contains one of the ``excluded`` tokens (case-insensitive, whole tokens:
    ``NC`` matches ``CC BY-NC-SA`` but not ``CC0`` or ``UNCLEAR``)."""
    if not excluded or not license_text:
        return False
    tokens = {t for t in re.split(r"[^0-9A-Za-z.]+", license_text.upper()) if t}
    return any(e.strip().upper() in tokens for e in excluded if e.strip())


@dataclass
class LabelledSet:
    """Cleaned spectra and their structures, per ion mode, with what was skipped and why.

    Attributes
    ----------
    spectra, molecules : dict
        Ion mode -> list of ``Spectrum`` / ``Molecule`` (aligned).
    skipped : Counter
        Reason -> count.
    licenses : dict
        Ion mode -> Counter of licence strings of the records used.
    n_read : int
        Records read (including the reader's skipped records).
    """

    spectra: dict[str, list] = field(default_factory=dict)
    molecules: dict[str, list] = field(default_factory=dict)
    skipped: Counter = field(default_factory=Counter)
    licenses: dict[str, Counter] = field(default_factory=dict)
    n_read: int = 0

    def n_used(self, mode: str | None = None) -> int:
        modes = [mode] if mode else list(self.spectra)
        return sum(len(self.spectra.get(m, [])) for m in modes)

    def n_structures(self, mode: str) -> int:
        return len({m.inchikey14 for m in self.molecules.get(mode, [])})


def load_labelled(paths: Iterable[str | Path], options: TrainOptions, progress: bool = False,
                  what: str = "training") -> LabelledSet:
    """Read, filter, label and clean spectra files (see the module docstring for the skip reasons).

    Raises
    ------
    InputError
        A file that is not spectra (unknown extension, binary...), from the readers.
    """
    from molpredict.chem.molecules import label_structure
    from molpredict.spectra.cleaning import CleaningPipeline
    from molpredict.io import SkipReport, read_spectra

    cleaning = CleaningPipeline.from_dict(options.cleaning) if options.cleaning else CleaningPipeline()
    wanted = set(options.ion_modes) if options.ion_modes else None
    out = LabelledSet()
    structures: dict[str, Any] = {}  # SMILES -> Molecule or error reason (many spectra share a structure)
    for path in paths:
        report = SkipReport()
        iterator = read_spectra(path, report=report)
        if progress:
            from tqdm import tqdm
            iterator = tqdm(iterator, desc=f"reading {Path(path).name}", unit=" spectra", file=sys.stderr,
                            leave=False)
        for spectrum in iterator:
            out.n_read += 1
            mode = spectrum_ion_mode(spectrum)
            if mode is None:
                out.skipped["no ion mode"] += 1
                continue
            if wanted is not None and mode not in wanted:
                out.skipped[f"ion mode {mode} not requested"] += 1
                continue
            licence = spectrum.metadata.get("license") or None
            if license_excluded(licence, options.exclude_licenses):
                out.skipped["licence excluded"] += 1
                continue
            smiles = spectrum.smiles
            inchi = spectrum.metadata.get("inchi") or None
            if not smiles and not inchi:
                out.skipped["no structure (SMILES or InChI)"] += 1
                continue
            molecule = label_structure(structures, smiles, inchi)
            if isinstance(molecule, str):
                out.skipped[molecule] += 1
                continue
            if not spectrum.formula:  # the formula-annotation kernel reads it; the label structure knows it
                spectrum.metadata["formula"] = molecule.formula
            cleaned = cleaning.clean_or_reason(spectrum)
            if isinstance(cleaned, str):
                out.skipped[cleaned] += 1
                continue
            out.spectra.setdefault(mode, []).append(cleaned)
            out.molecules.setdefault(mode, []).append(molecule)
            out.licenses.setdefault(mode, Counter())[licence or "unknown"] += 1
        for reason, n in report.by_reason().items():
            out.skipped[f"unreadable record ({reason})"] += n
            out.n_read += n
    return out


def check_component_names(options: TrainOptions, registry: Any = None) -> None:
    """Raise the :class:`SpecError` that building the model would raise later for an unknown component name or
    parameter name in ``options`` (the model, its kernels and sketches; every alternative of a grid ``a|b``).

    Values are checked where the components are built: some depend on the data (``gamma=auto``)."""
    if registry is None:
        from molpredict.registry import get_registry
        registry = get_registry()
    for kind, text in [("model", options.model), ("input_kernel", options.input_kernel),
                       ("output_kernel", options.output_kernel), ("sketch", options.input_sketch),
                       ("sketch", options.output_sketch)]:
        if text is None:
            continue
        # parsed as they are built: the model by build_model, its components by create_component (";" for ",")
        spec = parse_spec(text if kind == "model" else nested_spec(text))
        if "|" in spec.name:  # the model searches grids of parameter values only: it would fail after the data
            raise SpecError(f"{text!r}: a grid is over parameter values (e.g. ppk:mz_sigma=0.01|0.02), not over "
                            f"component names; train once per {kind.replace('_', ' ')}")
        if kind == "sketch" and is_no_sketch(spec.name) and not spec.params:
            continue  # no sketch: make_sketch's IdentitySketch, not a registered name
        registry.check_names(kind, spec.name.strip(), spec.params)


def check_train_options(options: TrainOptions) -> None:
    """Refuse, before any data is read, the option values the fit would refuse only after reading it: ``lam``
    (``options.lam`` or the model spec's; positive finite numbers, a grid ``a|b|c``) and the device (a name
    :func:`~molpredict.engine.device.resolve_device` knows, CUDA only where present).

    Raises
    ------
    SpecError
        A bad ``lam`` or device name.
    ResourceError
        A CUDA device that is not present.
    """
    from molpredict.engine.device import resolve_device
    from molpredict.models.okr import lam_grid

    model_lam = parse_spec(options.model).params.get("lam")
    for where, lam in (("--lam", options.lam), (f"--model {options.model}", model_lam)):
        if lam is None:
            continue
        # the models' own reading of lam (okr.lam_grid), which the fit would apply after reading the data
        try:
            values = lam_grid(list(lam.values) if isinstance(lam, Grid) else lam.strip() if isinstance(lam, str)
                              else lam)
        except SpecError as exc:
            raise SpecError(f"{where}: {exc}") from None
        if not values:
            raise SpecError(f"{where}: lam must be positive numbers (a value or a grid a|b|c), not {str(lam)!r}")
    resolve_device(options.device)


def build_model(model_spec: str, params: dict[str, Any], registry: Any = None) -> Any:
    """Instantiate a model from ``name[:key=value,...]`` plus ``params`` (only those the model accepts; values
    given in the spec win). Grids (``a|b``) are passed to the model as strings for it to search."""
    if registry is None:
        from molpredict.registry import get_registry
        registry = get_registry()
    spec = parse_spec(model_spec)
    cls = registry.get("model", spec.name)
    valid = set(cls.param_names())
    unknown = sorted(set(spec.params) - valid)
    if unknown:
        raise SpecError(f"model {spec.name!r} has no parameter(s) {', '.join(unknown)}; valid: "
                        f"{', '.join(sorted(valid))}")
    kwargs = {k: v for k, v in params.items() if k in valid and v is not None}
    kwargs.update({k: (str(v) if isinstance(v, Grid) else v) for k, v in spec.params.items()})
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"model {spec}: {exc}") from exc


def _selection(model: Any) -> Any:
    selection = getattr(model, "selection_", None)
    return json_ready(selection) if selection is not None else None


def train_bundle(train_paths: Sequence[str | Path], options: TrainOptions,
                 val_paths: Sequence[str | Path] = (), progress: bool = True,
                 log: Any = None) -> tuple[ModelBundle, dict[str, Any]]:
    """Train one model per ion mode and return the bundle and a JSON-ready summary.

    Parameters
    ----------
    train_paths : sequence of path
        Spectra files with structures (MGF, MSP, mzML); or text-pairs tables (``.tsv``/``.csv`` with
        ``description`` and ``smiles`` columns), which train one ``text`` model (:func:`train_text_bundle`).
    options : TrainOptions
    val_paths : sequence of path
        Validation spectra: grid parameters are chosen on their kernel loss (no decoding).
    progress : bool
        tqdm progress bars on stderr.
    log : callable, optional
        ``log(message)`` for one-line status messages (default: nothing).

    Raises
    ------
    InputError
        No usable training spectra (for an asked ion mode).
    """
    from molpredict.io.text_pairs import split_inputs

    check_component_names(options)  # a typo fails now, not after the training data has been read
    check_train_options(options)  # so do a bad lam and a missing device
    if split_inputs(list(train_paths) + list(val_paths), what="train"):
        return train_text_bundle(train_paths, options, val_paths=val_paths, log=log)
    say = log or (lambda message: None)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    train = load_labelled(train_paths, options, progress=progress)
    timings["read_train_s"] = time.perf_counter() - t0
    val = None
    if val_paths:
        t0 = time.perf_counter()
        val = load_labelled(val_paths, options, progress=progress, what="validation")
        timings["read_val_s"] = time.perf_counter() - t0
    modes = list(options.ion_modes) if options.ion_modes else [m for m in ION_MODES if train.n_used(m)]
    if not modes:
        reasons = ", ".join(f"{n} {r}" for r, n in train.skipped.most_common()) or "no records"
        raise InputError(f"no usable training spectra ({train.n_read} read; skipped: {reasons})",
                         path=", ".join(str(p) for p in train_paths))
    for mode in modes:
        if not train.n_used(mode):
            # say which modes the files do have: --ion-mode was given, so "use --ion-mode" told the user nothing (QA)
            others = [m for m in ION_MODES if m != mode and (train.n_used(m) or
                                                               train.skipped[f"ion mode {m} not requested"])]
            reasons = ", ".join(f"{n} {r}" for r, n in train.skipped.most_common()) or "no records"
            hint = (f"; the files have {' and '.join(others)} spectra: --ion-mode {others[0]} trains them"
                    if others else "")
            raise InputError(f"no usable {mode} training spectra ({train.n_read} read; skipped: {reasons}){hint}",
                             path=", ".join(str(p) for p in train_paths))
    train_keys = {mode: _structure_keys(train, mode) for mode in modes}
    if val is not None:  # grid points, the fusion and the calibration would be fitted on structures seen in training
        from molpredict.models.distinct import refuse_shared_structures

        for mode in modes:
            refuse_shared_structures(set(train_keys[mode]), set(_structure_keys(val, mode)),
                                     what=f"the {mode} validation spectra",
                                     path=", ".join(str(p) for p in val_paths))
    for mode in modes:
        _warn_degenerate_data(train, mode, train_keys[mode])
    from molpredict.chem.molecules import DEFAULT_ADDUCTS, remembered_fingerprints
    from molpredict.kernels.workers import rows_on_workers
    from molpredict.spectra.cleaning import CleaningPipeline

    cleaning = (CleaningPipeline.from_dict(options.cleaning) if options.cleaning else CleaningPipeline()).to_dict()
    train_hash = file_sha256(train_paths, extra=options.filters())
    bundle = ModelBundle()
    summary: dict[str, Any] = {
        "train_files": [str(p) for p in train_paths], "val_files": [str(p) for p in val_paths],
        "n_read": train.n_read, "skipped": dict(train.skipped.most_common()),
        "val_skipped": dict(val.skipped.most_common()) if val else None,
        "training_sha256": train_hash, "models": {}, "timings": timings,
    }
    sets = _validation_sets(options, val, modes, say) if val is not None else None
    calibration_sets = _calibration_sets(options) if sets else []
    for mode in modes:
        spectra, molecules = train.spectra[mode], train.molecules[mode]
        val_pair = None
        if val is not None and val.n_used(mode):
            from molpredict.models.base import ValidationData
            from molpredict.training.ranking_validation import ranking_candidates

            candidates = ranking_candidates(val.molecules[mode], sets, calibration_sets) if sets else None
            val_pair = ValidationData(val.spectra[mode], val.molecules[mode], candidates)
        # the validation candidates are featurised by the model, the prior and its reference test: once; the
        # spectrum kernels' large row requests (the landmarks against every training spectrum) run on every core
        with remembered_fingerprints(val_pair.candidates.molecules if val_pair is not None
                                     and val_pair.candidates is not None else ()), rows_on_workers():
            n_struct = train.n_structures(mode)
            model = build_model(options.model, options.component_params("spectrum", len(spectra), n_struct))
            if model.input_type != "spectrum":
                raise SpecError(f"model {options.model} takes {model.input_type} input, not spectra")
            if val_pair is not None and val_pair.candidates is not None:
                _fingerprint_on_cores(model, val_pair.candidates.molecules)
            say(f"training {model.registry_name or type(model).__name__} on {len(spectra)} {mode} spectra "
                f"({n_struct} structures)" + (f", selecting on {len(val_pair[0])} validation spectra" if val_pair
                                               else ""))
            t0 = time.perf_counter()
            model.fit(spectra, molecules, val=val_pair)
            fit_s = time.perf_counter() - t0
            validation = _validation(model, val_pair, "spectra", val.n_structures(mode) if val_pair else 0)
            held_out = _held_out_selection(model, molecules)
            if held_out:
                say(f"{mode}: no validation spectra: the grid point was chosen on {held_out['n_spectra']} "
                    f"training spectra of {held_out['n_structures']} structures held out "
                    f"({held_out['fraction']:.0%} of them), kernel loss {held_out['kernel_loss']:.4f}")
            _warn_tied_grid(model, mode)
            info = {
                "training": {"sha256": train_hash, "files": [Path(p).name for p in train_paths],
                             "filters": options.filters(), "n_spectra": len(spectra), "n_structures": n_struct,
                             "licenses": dict(train.licenses[mode].most_common())},
                "validation": validation,
                "selection": _selection(model),
                "timings": {"fit_s": fit_s},
            }
            adducts = [a.name for a in DEFAULT_ADDUCTS[mode]]
            sub = SubModel(model=model, ion_mode=mode, cleaning=cleaning, adducts=adducts, info=info)
            t0 = time.perf_counter()
            sub.prior = _fit_prior(options, spectra, molecules)
            if sets and val_pair is not None and getattr(val_pair, "candidates", None) is not None:
                from molpredict.training.ranking_validation import fit_submodel_scoring

                if options.fragments:
                    from molpredict.chem.fragment_model import FragmentModel, spectra_by_structure
                    from molpredict.chem.fragments import FragmentScorer
                    sub.fragments = FragmentScorer().get_params()
                    groups = spectra_by_structure(spectra, molecules, options.fragment_model_structures,
                                                  options.seed)
                    n_structures = len({m.inchikey14 or m.smiles for m in molecules})
                    say(f"fitting the fragmentation model on {len(groups)} training structures"
                        + (f" (a seeded sample of the {n_structures})" if len(groups) < n_structures else ""))
                    try:
                        sub.fragment_model = FragmentModel(seed=options.seed).fit(groups)
                    except InputError as exc:  # e.g. no fragment explains any training peak: fuse without it
                        say(f"no fragmentation model: {exc.message}")
                metric = options.select_by if options.select_by not in (None, "kernel-loss") else "mrr"
                say("fitting the score fusion and its calibration on the validation spectra")
                validation["ranking"] = fit_submodel_scoring(sub, val.spectra[mode], sets, metric=metric,
                                                             seed=options.seed, log=say, validation=val_pair,
                                                             calibration_collections=calibration_sets)
                if (sub.fragments is not None or sub.fragment_model is not None) and not any(
                        _uses_fragments(v["fusion"]) for v in sub.scoring.values()):
                    # validation chose no second pass: the bundle carries no fragmentation
                    sub.fragments = None
                    sub.fragment_model = None
                    say("the fragmentation terms did not improve validation ranking: left out")
            info["timings"]["scoring_s"] = time.perf_counter() - t0
            bundle.models[mode] = sub
            summary["models"][mode] = {
                "model": str(options.model), "params": json_ready(model.get_params()),
                "chosen": json_ready(_chosen(model)), "n_spectra": len(spectra), "n_structures": n_struct,
                "licenses": dict(train.licenses[mode].most_common()), "validation": validation,
                "fit_s": fit_s,
            }
            if held_out:
                summary["models"][mode]["held_out_selection"] = held_out
            finetune = _finetune_summary(model)
            if finetune:  # printed with the closing summary (format_summary)
                summary["models"][mode]["finetune"] = finetune
            head = _head_summary(model)
            if head:
                summary["models"][mode]["fingerprint_head"] = head
    return bundle, summary


def _structure_keys(data: LabelledSet, mode: str) -> list[str]:
    """Each labelled spectrum's structure as evaluation and property training key it
    (:func:`~molpredict.chem.molecules.spectrum_structure_key`: the INCHIKEY's first block, else the SMILES'),
    else its label's first block; the labels seed the memo, so no SMILES is parsed twice."""
    from molpredict.chem.molecules import spectrum_structure_key

    spectra, molecules = data.spectra.get(mode, []), data.molecules.get(mode, [])
    parsed = {s.smiles: m.inchikey14 for s, m in zip(spectra, molecules) if isinstance(s.smiles, str)}
    return [spectrum_structure_key(s, parsed) or m.inchikey14 for s, m in zip(spectra, molecules)]


def _warn_degenerate_data(data: LabelledSet, mode: str, keys: Sequence[str]) -> None:
    """One warning per degenerate property of a mode's training spectra that the fit accepts: fewer than
    :data:`MIN_STRUCTURES` distinct structures, and spectra that repeat another (same structure, precursor and
    peaks after cleaning: each copy weighs its structure once more, as a second measurement would not)."""
    n_structures = len(set(keys))
    if n_structures < MIN_STRUCTURES:
        warnings.warn(f"{mode}: the training spectra hold {n_structures} distinct structure"
                      f"{'s' if n_structures != 1 else ''} (fewer than {MIN_STRUCTURES}): the model can predict "
                      f"little beyond them and its selection rests on very few structures", UserWarning,
                      stacklevel=3)
    seen: set = set()
    duplicates = 0
    for spectrum, key in zip(data.spectra.get(mode, []), keys):
        signature = (key, round(float(spectrum.precursor_mz or 0.0), 6), np.asarray(spectrum.mz).tobytes(),
                     np.asarray(spectrum.intensities).tobytes())
        duplicates += signature in seen
        seen.add(signature)
    if duplicates:
        warnings.warn(f"{mode}: {duplicates} training spectr{'a repeat' if duplicates > 1 else 'um repeats'} "
                      f"another (same structure, precursor and peaks): used as given", UserWarning, stacklevel=3)


def _selection_values(model: Any) -> tuple[list[dict[str, Any]], str, list[float]]:
    """A grid search's points, the key it chose by (``val_<metric>`` or ``val_loss``) and each point's value."""
    selection = getattr(model, "selection_", None)
    if not isinstance(selection, dict):
        return [], "", []
    points = selection.get("points") or []
    key = f"val_{selection.get('select_by')}"
    key = key if points and all(key in p for p in points) else "val_loss"
    values = [float(p[key]) if p.get(key) is not None else math.nan for p in points]
    return points, key, values


def _warn_tied_grid(model: Any, mode: str) -> None:
    """Warn when every point of a grid search scored the same: the first was kept, by order, not by the data."""
    points, key, values = _selection_values(model)
    if len(points) < 2 or not all(math.isfinite(v) for v in values):
        return
    if max(values) - min(values) <= 1e-12 * max(1.0, abs(values[0])):
        best = points[model.selection_.get("best", 0)]
        chosen = ", ".join(f"{k} {best[k]}" for k in ("lam", "input_kernel", "output_kernel") if k in best)
        where = "held-out" if model.selection_.get("source") == "held-out" else "validation"
        warnings.warn(f"{mode}: the {len(points)} grid points tie on the {where} {key.removeprefix('val_')} "
                      f"({values[0]:.6g}): the first ({chosen}) was kept; the data cannot choose", UserWarning,
                      stacklevel=3)


def _held_out_selection(model: Any, molecules: Sequence[Any]) -> dict[str, Any] | None:
    """What a grid search without validation spectra was chosen on: the model held out a seeded fraction of the
    training structures (its ``val_fraction`` and ``seed``, the split redone here to count it) and recorded each
    point's loss; None when the model did not."""
    selection = getattr(model, "selection_", None)
    fraction = getattr(model, "val_fraction", None)
    if not isinstance(selection, dict) or selection.get("source") != "held-out" or fraction is None:
        return None
    from molpredict.models.distinct import split_by_structure

    _, held = split_by_structure(list(molecules), float(fraction), int(getattr(model, "seed", 0)))
    points, best = selection.get("points") or [], selection.get("best")
    loss = points[best].get("val_loss") if isinstance(best, int) and 0 <= best < len(points) else None
    return {"fraction": float(fraction), "n_spectra": int(held.size),
            "n_structures": len({molecules[i].inchikey14 for i in held}),
            "kernel_loss": float(loss) if loss is not None else math.nan}


def _chosen_point_record(model: Any, key: str) -> tuple[dict[str, Any] | None, str]:
    """The ``key`` record of the model's chosen grid point (SISOKR's ``finetune``, ``fingerprint_head``) and the
    selection metric; (None, metric) for a model without one."""
    selection = getattr(model, "selection_", None)
    if not isinstance(selection, dict) or not isinstance(selection.get("best"), int):
        return None, "mrr"
    points = selection.get("points") or []
    record = points[selection["best"]].get(key) if selection["best"] < len(points) else None
    return record or None, selection.get("select_by", "mrr")


def _finetune_summary(model: Any) -> dict[str, Any] | None:
    """What the model's ranking fine-tune did (SISOKR's ``finetune`` record of the chosen grid point), without
    its per-check history; None for a model without one."""
    record, metric = _chosen_point_record(model, "finetune")
    if not record:
        return None
    history = record["history"]
    seen = history.get("best_seen")
    return {"metric": metric, "ridge": history["init"], "best": (history["checks"][seen]["value"]
                                                                 if seen is not None else history["init"]),
            "kept": bool(record["improved"]), "min_gain": record.get("min_gain", 0.0),
            "epochs_run": history["epochs_run"]}


def _finetune_line(finetune: dict[str, Any]) -> str:
    verdict = "kept" if finetune["kept"] else f"not kept (gain under {finetune['min_gain']:g}): the ridge solution"
    return (f"  ranking fine-tune: validation {finetune['metric']} {finetune['ridge']:.4f} -> {finetune['best']:.4f} "
            f"in {finetune['epochs_run']} epoch(s), {verdict}")


def _head_summary(model: Any) -> dict[str, Any] | None:
    """What the model's fingerprint likelihood head did (SISOKR's ``fingerprint_head`` record of the chosen grid
    point): the validation metric without and with it, its weight, whether it was kept; None without one."""
    record, metric = _chosen_point_record(model, "fingerprint_head")
    if not record:
        return None
    tried = record[f"val_{metric}"]
    return {"metric": metric, "without": tried["0.0"], "with": tried[str(record["weight"])],
            "weight": record["weight"], "kept": bool(record["kept"]), "lam": record["lam"],
            "seconds": record.get("seconds")}


def _head_line(head: dict[str, Any]) -> str:
    verdict = "kept" if head["kept"] else "not kept: the model's own score"
    return (f"  fingerprint likelihood head: validation {head['metric']} {head['without']:.4f} -> {head['with']:.4f} "
            f"(weight {head['weight']:g}, lam {head['lam']:g}), {verdict}")


def _uses_fragments(fusion: dict[str, Any]) -> bool:
    """Whether a fitted fusion (``ScoreFusion.to_dict()``) reads a fragment term (a weight, or a ranker)."""
    from molpredict.identification.fusion import FRAGMENT_MODEL, FRAGMENTS

    if fusion.get("rerank"):
        return True
    if fusion.get("ranker"):
        return any(t in fusion["ranker"]["terms"] for t in (FRAGMENTS, FRAGMENT_MODEL))
    return any(fusion["weights"].get(t) for t in (FRAGMENTS, FRAGMENT_MODEL))


def _calibration_sets(options: TrainOptions) -> list[dict[str, list[tuple[str, str]]]]:
    """The ``calibration_candidates`` collections (calibration only), one per file; none when not given."""
    from molpredict.chem.candidates import load_candidate_sets

    paths = options.calibration_candidates
    if not paths:
        return []
    return [load_candidate_sets(path) for path in ([paths] if isinstance(paths, (str, Path)) else list(paths))]


def _validation_sets(options: TrainOptions, val: LabelledSet, modes: Sequence[str], say: Any
                     ) -> list[dict[str, list[tuple[str, str]]]] | None:
    """Candidate-set collections for the validation structures: one per ``val_candidates`` file, else one drawn
    from ``library``, else None (ranking-aware selection then falls back on the kernel loss)."""
    from molpredict.chem.candidates import load_candidate_sets
    from molpredict.training.ranking_validation import candidate_sets_from_library

    if options.val_candidates:
        paths = [options.val_candidates] if isinstance(options.val_candidates, (str, Path)) \
            else list(options.val_candidates)
        return [load_candidate_sets(path) for path in paths]
    from molpredict import config

    library_path = options.library or config.default_library()
    if library_path:
        from molpredict.chem.candidates import read_library

        library = read_library(library_path)
        molecules = [m for mode in modes for m in val.molecules.get(mode, [])]
        sets = candidate_sets_from_library(library, molecules, seed=options.seed)
        say(f"validation candidate sets: {len(sets)} structures with their same-formula structures from "
            f"{library_path}" + ("" if options.library else " (the configured default library)"))
        return [sets]
    say("no validation candidate sets (--val-candidates, --library or a configured library): grid points are "
        "chosen by the kernel loss, and the bundle has no fusion with the prior and no probability")
    return None


def _fingerprint_on_cores(model: Any, molecules: Sequence[Any]) -> None:
    """Fingerprint the validation candidates on every core with the model's output kernel setting (Morgan bits by
    default, also the prior's), inside their ``remembered_fingerprints`` block, so that the model's and the
    prior's kernel rows read them instead of parsing each SMILES on one core. An output kernel that is no single
    fingerprint setting (a graph kernel, a grid of kernels) is left to featurise as before."""
    from molpredict.registry import create
    from molpredict.specs import nested_spec

    spec = getattr(model, "output_kernel", None)
    if not isinstance(spec, str):
        return
    try:
        parsed = parse_spec(nested_spec(spec))  # as the models read it (a nested spec writes ';' for ',')
        if parsed.is_grid:
            return
        kernel = create("output_kernel", parsed)
    except SpecError:
        return
    if hasattr(kernel, "fingerprint_on_cores"):
        kernel.fingerprint_on_cores(molecules)


def _fit_prior(options: TrainOptions, spectra: Sequence[Any], molecules: Sequence[Any]) -> Any:
    """The structure prior: similarity to the training structures (``train``), to a reference library's
    structures (a path), or None (``none``)."""
    if options.prior in (None, "", "none", "off"):
        return None
    prior = build_model("prior", {})  # through the registry: the bundle names it by its registry name
    if options.prior == "train":
        return prior.fit(spectra, molecules)
    from molpredict.chem.candidates import read_library

    library = read_library(options.prior)
    reference = library.molecules(np.arange(len(library)))
    return prior.fit(reference, reference)


def _validation(model: Any, val_pair: tuple[list, list] | None, unit: str, n_structures: int) -> dict[str, Any]:
    """The fitted model's mean kernel loss on the validation pairs, their counts (``n_<unit>``,
    ``n_structures``) and the time taken; empty without validation data or a model ``kernel_loss``.

    A grid search on these pairs recorded the chosen point's loss already (``selection_``; the same quantity,
    tests/test_okr.py checks they agree): it is taken from there instead of predicting the pairs again."""
    if val_pair is None or not hasattr(model, "kernel_loss"):
        return {}
    t0 = time.perf_counter()
    selection = getattr(model, "selection_", None)
    selection = selection if isinstance(selection, dict) and selection.get("source") == "val" else {}
    points, best = selection.get("points") or [], selection.get("best")
    recorded = points[best].get("val_loss") if isinstance(best, int) and 0 <= best < len(points) else None
    loss = float(recorded) if recorded is not None and np.isfinite(recorded) else float(model.kernel_loss(*val_pair))
    return {"kernel_loss": loss, f"n_{unit}": len(val_pair[0]), "n_structures": n_structures,
            "time_s": time.perf_counter() - t0}


def _chosen(model: Any) -> dict[str, Any]:
    """Fitted choices the model exposes (attributes ending in ``_`` that are JSON scalars or short specs)."""
    chosen = {}
    for name, value in vars(model).items():
        if name.endswith("_") and not name.startswith("_") and isinstance(value, (int, float, str, bool)):
            chosen[name] = value
    return chosen


def format_summary(summary: dict[str, Any]) -> str:
    """The closing summary of ``molpredict train`` as a few human-readable lines."""
    lines = []
    text = summary.get("input_type") == "text"
    unit = "pairs" if text else "spectra"
    used = sum(m[f"n_{unit}"] for m in summary["models"].values())
    skipped = sum(summary["skipped"].values())
    lines.append(f"read {summary['n_read']} {'description/SMILES pairs' if text else 'spectra'}: {used} used, "
                 f"{skipped} skipped")
    for reason, n in summary["skipped"].items():
        lines.append(f"  skipped {n}: {reason}")
    for mode, info in summary["models"].items():
        lines.append(f"{mode}: {info[f'n_{unit}']} {unit}, {info['n_structures']} structures, fit "
                     f"{info['fit_s']:.1f} s")
        for key, value in info["chosen"].items():
            if key.endswith("spec_") or key == "lam_":
                lines.append(f"  {key.removesuffix('_').removesuffix('_spec').replace('_', ' ')}: {value}")
        if info.get("finetune"):
            lines.append(_finetune_line(info["finetune"]))
        if info.get("fingerprint_head"):
            lines.append(_head_line(info["fingerprint_head"]))
        val = info.get("validation") or {}
        if "kernel_loss" in val:
            lines.append(f"  validation kernel loss {val['kernel_loss']:.4f} on {val[f'n_{unit}']} {unit} "
                         f"({val['n_structures']} structures)")
        held = info.get("held_out_selection")
        if held:
            lines.append(f"  held-out selection: kernel loss {held['kernel_loss']:.4f} on {held['n_spectra']} "
                         f"training {unit} ({held['n_structures']} structures, {held['fraction']:.0%}), not "
                         f"a test: the chosen model is refitted on them")
        if "licenses" in info:
            licences = ", ".join(f"{k}: {v}" for k, v in info["licenses"].items())
            lines.append(f"  licences: {licences}")
    timings = summary.get("timings", {})
    if timings:
        lines.append("timings: " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------
# text -> molecule
# ----------------------------------------------------------------------------------------------------------

def train_text_bundle(train_paths: Sequence[str | Path], options: TrainOptions,
                      val_paths: Sequence[str | Path] = (), log: Any = None
                      ) -> tuple[ModelBundle, dict[str, Any]]:
    """Train one text -> molecule model on pairs tables and return the bundle (key ``text``) and a summary.

    Parameters
    ----------
    train_paths : sequence of path
        Pairs tables (see :mod:`molpredict.io.text_pairs`); rows with an empty description or an unusable SMILES
        are skipped and counted (``summary["skipped"]``; the first 100 with file, line and field in
        ``summary["skipped_rows"]``).
    options : TrainOptions
        ``ion_modes``, ``exclude_licenses`` and ``cleaning`` do not apply to text and must be left unset.
    val_paths : sequence of path
        Validation pairs: grid parameters (or DSOKR's early stopping) are chosen on them.
    log : callable, optional

    Raises
    ------
    InputError
        No usable pairs, or spectra-only options given.
    SpecError
        A model / input kernel / encoder that does not take text.
    """
    from molpredict.modelfile import TEXT_MODE
    from molpredict.io.text_pairs import PairsReport, read_text_pairs

    say = log or (lambda message: None)
    where = ", ".join(str(p) for p in train_paths)
    if options.ion_modes or options.exclude_licenses:
        raise InputError("--ion-mode and --exclude-license apply to spectra, not to text-pairs tables", path=where)
    timings: dict[str, float] = {}
    structures: dict[str, Any] = {}
    t0 = time.perf_counter()
    report = PairsReport()
    pairs = [p for path in train_paths for p in read_text_pairs(path, report, structures)]
    timings["read_train_s"] = time.perf_counter() - t0
    val_report = PairsReport()
    val_pairs: list = []
    if val_paths:
        t0 = time.perf_counter()
        val_pairs = [p for path in val_paths for p in read_text_pairs(path, val_report, structures)]
        timings["read_val_s"] = time.perf_counter() - t0
    for entries, what in ((list(report), "training"), (list(val_report), "validation")):
        for entry in entries[:5]:
            say(f"skipped {entry}")
        if len(entries) > 5:
            say(f"... and {len(entries) - 5} more skipped {what} rows (summary: skipped_rows)")
    if len(report) and len(pairs) >= 2:
        # the API's caller sees no log (only summary["skipped_rows"]): one warning, so that no row is dropped
        # silently; with fewer than two usable pairs the error below says it
        warnings.warn(f"{len(report)} training row{'s' if len(report) > 1 else ''} skipped (first: "
                      f"{next(iter(report))})", UserWarning, stacklevel=3)
    if len(pairs) < 2:
        reasons = ", ".join(f"{n} {r}" for r, n in report.by_reason().items()) or "no rows"
        raise InputError(f"fewer than two usable description/SMILES pairs ({report.n_read} read; skipped: "
                         f"{reasons})", path=where)
    texts = [p.description for p in pairs]
    molecules = [p.molecule for p in pairs]
    n_struct = len({m.inchikey for m in molecules})
    params = options.component_params("text", len(pairs), n_struct)
    model = build_model(options.model, params)
    if model.input_type != "text":
        spec = params.get("input_kernel") or params.get("encoder") or options.model
        raise SpecError(f"model {options.model} with {spec} takes spectra, not text: give a "
                        f"text input kernel (--input-kernel text-ngram or text-embedding) or a text encoder")
    val_pair = ([p.description for p in val_pairs], [p.molecule for p in val_pairs]) if val_pairs else None
    say(f"training {model.registry_name or type(model).__name__} on {len(pairs)} text pairs ({n_struct} "
        f"structures)" + (f", selecting on {len(val_pairs)} validation pairs" if val_pair else ""))
    t0 = time.perf_counter()
    model.fit(texts, molecules, val=val_pair)
    fit_s = time.perf_counter() - t0
    validation = _validation(model, val_pair, "pairs", len({p.molecule.inchikey for p in val_pairs}))
    filters = {"input": "text", "skip": "empty description, unusable SMILES"}
    train_hash = file_sha256(train_paths, extra=filters)
    info = {
        "training": {"sha256": train_hash, "files": [Path(p).name for p in train_paths], "filters": filters,
                     "n_pairs": len(pairs), "n_structures": n_struct},
        "validation": validation,
        "selection": _selection(model),
        "timings": {"fit_s": fit_s},
    }
    bundle = ModelBundle()
    bundle.models[TEXT_MODE] = SubModel(model=model, ion_mode=TEXT_MODE, cleaning=None, adducts=[], info=info)
    summary: dict[str, Any] = {
        "input_type": "text",
        "train_files": [str(p) for p in train_paths], "val_files": [str(p) for p in val_paths],
        "n_read": report.n_read, "skipped": report.by_reason(), "skipped_rows": report.to_list(),
        "val_skipped": val_report.by_reason() if val_paths else None,
        "training_sha256": train_hash, "timings": timings,
        "models": {TEXT_MODE: {
            "model": str(options.model), "params": json_ready(model.get_params()),
            "chosen": json_ready(_chosen(model)), "n_pairs": len(pairs), "n_structures": n_struct,
            "validation": validation, "fit_s": fit_s}},
    }
    return bundle, summary
