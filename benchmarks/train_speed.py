"""Profile of the default training (``make demo``'s, positive mode), stage by stage: CPU seconds, wall seconds,
peak memory and each stage's share; before (a reference tree) and after (this tree) in one run.

Run as::

    python benchmarks/train_speed.py --data DIR --val-candidates A.json --val-candidates B.json \
        [--reference /path/to/old/tree] [--out docs/benchmarks/train_speed]
    python benchmarks/train_speed.py ... --device cuda --reference-device cpu   # GPU against CPU, this tree

Each tree is timed in its own child process (``PYTHONPATH`` set to the tree), so the two never share caches.
With ``--reference-device`` (and no ``--reference``) the reference is this tree trained on that device, so a GPU
run is read beside the same machine's CPU run. On CUDA every stage boundary synchronises the device, so the
time of queued kernels is charged to the stage that launched them.

Stages are attributed by wrapping the functions that do the work (exclusive time: a stage nested in another,
e.g. the input kernel rows computed while scoring validation spectra, counts for the inner one; the nesting is
kept in ``paths``). Stages:

- ``reading``: parsing the MGF files (load_labelled outside cleaning and labelling);
- ``labelling``: SMILES -> structure (RDKit) of the labels;
- ``cleaning``: the cleaning pipeline;
- ``input kernel rows``: featurising spectra and their kernel rows against the input landmarks (training rows,
  validation rows, predictions);
- ``output kernel rows``: structure kernel rows (output landmarks, validation candidates);
- ``eigendecompositions``: every eigh;
- ``lam grid``: ranking the validation candidate sets at each grid point;
- ``model linear algebra``: the rest of the fit (products, whitening, weights);
- ``ranking fine-tune``: the chosen core fine-tuned with the ranking loss (torch: the part a GPU speeds most);
- ``validation scoring``: scoring the validation candidate sets with the chosen model for the fusion (outside
  the kernel rows);
- ``prior``: fitting the structure prior and scoring candidates with it (outside the kernel rows);
- ``fragment model``: fitting the learnt fragmentation model on the training spectra;
- ``fusion``, ``calibration``: fitting the fusion weights, the calibrator and their report;
- ``other``: the rest.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGES = ["reading", "labelling", "cleaning", "input kernel rows", "output kernel rows", "eigendecompositions",
          "lam grid", "model linear algebra", "ranking fine-tune", "validation scoring", "prior", "fragment model",
          "fusion", "calibration", "other"]


# ------------------------------------------------------------------------------------------------------------
# the child: one training, instrumented
# ------------------------------------------------------------------------------------------------------------
class _Clock:
    """Exclusive CPU / wall seconds per stage path (a stack of stage names)."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.cpu: dict[tuple, float] = {}
        self.wall: dict[tuple, float] = {}
        self.calls: dict[str, int] = {}
        self.peak_kb: dict[str, int] = {}
        self._mark = (time.process_time(), time.perf_counter())
        self.synchronize = None  # torch.cuda.synchronize when training on a GPU
        self._start = time.perf_counter()
        self.entered: list[float] = []

    def _charge(self) -> None:
        if self.synchronize is not None:
            self.synchronize()
        cpu, wall = time.process_time(), time.perf_counter()
        key = tuple(self.stack) or ("other",)
        self.cpu[key] = self.cpu.get(key, 0.0) + cpu - self._mark[0]
        self.wall[key] = self.wall.get(key, 0.0) + wall - self._mark[1]
        self._mark = (cpu, wall)

    def _trace(self, stage: str, entered: float) -> None:
        now = time.perf_counter()
        if os.environ.get("TRAIN_SPEED_TRACE") and now - entered >= 1.0:  # a run cut short still tells where
            print(f"[trace {now - self._start:8.1f} s] {'/'.join(self.stack + [stage])}: {now - entered:.1f} s",
                  file=sys.stderr, flush=True)

    def enter(self, stage: str) -> bool:
        if self.stack and self.stack[-1] == stage:  # recursion into the same stage: no new level
            return False
        self._charge()
        self.stack.append(stage)
        self.entered.append(time.perf_counter())
        self.calls[stage] = self.calls.get(stage, 0) + 1
        return True

    def leave(self, stage: str) -> None:
        self._charge()
        self.stack.pop()
        self._trace(stage, self.entered.pop())
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self.peak_kb[stage] = max(self.peak_kb.get(stage, 0), rss)


CLOCK = _Clock()


def _timed(fn, stage):
    if callable(stage):
        pick = stage
    else:
        pick = (lambda *a, **k: stage)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        name = pick(*args, **kwargs)
        pushed = CLOCK.enter(name)
        try:
            result = fn(*args, **kwargs)
        finally:
            if pushed:
                CLOCK.leave(name)
        return result
    wrapper.__timed__ = True
    return wrapper


def _module(*names):
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def _patch_function(modules, attr, stage):
    """Wrap the function ``attr`` of the first importable module, and every molpredict module's reference to it."""
    module = _module(*modules)
    if module is None or not hasattr(module, attr):
        return False
    original = getattr(module, attr)
    if getattr(original, "__timed__", False):
        return True
    wrapped = _timed(original, stage)
    for name, mod in list(sys.modules.items()):
        if (name == "molpredict" or name.startswith("molpredict.")) and mod is not None:
            if getattr(mod, attr, None) is original:
                setattr(mod, attr, wrapped)
    return True


def _patch_method(modules, cls_name, attr, stage):
    module = _module(*modules)
    cls = getattr(module, cls_name, None) if module is not None else None
    if cls is None or attr not in cls.__dict__:
        return False
    original = cls.__dict__[attr]
    if isinstance(original, classmethod):
        setattr(cls, attr, classmethod(_timed(original.__func__, stage)))
    else:
        setattr(cls, attr, _timed(original, stage))
    return True


def _instrument() -> list[str]:
    import torch

    missing = []

    def need(ok, what):
        if not ok:
            missing.append(what)

    # import everything first so that re-exports can be found and patched
    for name in ("molpredict.training.pipeline", "molpredict.training", "molpredict.training.ranking_validation",
                 "molpredict.ranking_validation", "molpredict.kernels.mkl", "molpredict.models.okr",
                 "molpredict.identification.fusion", "molpredict.fusion", "molpredict.identification.calibration",
                 "molpredict.calibration", "molpredict.nystrom", "molpredict.engine.nystrom",
                 "molpredict.linalg", "molpredict.engine.linalg"):
        _module(name)
    need(_patch_function(["molpredict.training.pipeline", "molpredict.training"], "load_labelled", "reading"),
         "load_labelled")
    need(_patch_method(["molpredict.spectra.cleaning", "molpredict.spectra"], "CleaningPipeline", "__call__",
                       "cleaning"), "CleaningPipeline.__call__")
    need(_patch_function(["molpredict.chem.molecules", "molpredict.molecules"], "label_structure", "labelling"),
         "label_structure")
    base = _module("molpredict.kernels.base")

    def kernel_stage(self, *args, **kwargs):
        return "input kernel rows" if isinstance(self, base.InputKernel) else "output kernel rows"

    for attr in ("fit", "fit_features", "transform", "transform_features", "gram", "_transform_features"):
        need(_patch_method(["molpredict.kernels.base"], "Kernel", attr, kernel_stage), f"Kernel.{attr}")
    for cls in ("MKLKernel",):
        for attr in ("fit", "featurize", "pairwise"):
            _patch_method(["molpredict.kernels.mkl"], cls, attr, "input kernel rows")
    # the eigendecompositions
    original_eigh = torch.linalg.eigh
    torch.linalg.eigh = _timed(original_eigh, "eigendecompositions")
    need(_patch_function(["molpredict.engine.linalg", "molpredict.linalg"], "truncated_eigh", "eigendecompositions"),
         "truncated_eigh")
    _patch_function(["molpredict.engine.linalg"], "symmetric_eigh", "eigendecompositions")  # CPU: SciPy's (after)
    okr = ["molpredict.models.okr"]
    need(_patch_method(okr, "_OKRBase", "fit", "model linear algebra"), "_OKRBase.fit")
    for cls, attr in (("_OutputSide", "val_ranking"), ("_OutputSide", "val_loss")):
        need(_patch_method(okr, cls, attr, "lam grid"), f"{cls}.{attr}")
    _patch_method(okr, "_WhitenedInput", "val_core", "lam grid")
    rv = ["molpredict.training.ranking_validation", "molpredict.ranking_validation"]
    need(_patch_function(rv, "validation_terms", "validation scoring"), "validation_terms")
    _patch_function(rv, "validation_scores", "validation scoring")  # the shared pass (after)
    need(_patch_function(rv, "fit_scoring", "calibration"), "fit_scoring")
    need(_patch_function(["molpredict.identification.fusion", "molpredict.fusion"], "fit_fusion", "fusion"),
         "fit_fusion")
    need(_patch_method(["molpredict.identification.calibration", "molpredict.calibration"], "Calibrator", "fit",
                       "calibration"), "Calibrator.fit")
    need(_patch_function(["molpredict.training.pipeline", "molpredict.training"], "_fit_prior", "prior"),
         "_fit_prior")
    for attr in ("finetune_core", "fit_ranking"):
        need(_patch_function(["molpredict.models.ranking_finetune"], attr, "ranking fine-tune"), attr)
    need(_patch_method(["molpredict.chem.fragment_model"], "FragmentModel", "fit", "fragment model"),
         "FragmentModel.fit")
    for attr in ("fit", "candidate_coordinates"):
        need(_patch_method(["molpredict.models.baselines"], "PriorBaseline", attr, "prior"), f"PriorBaseline.{attr}")
    return missing


def child(args: argparse.Namespace) -> None:
    import warnings

    import torch

    missing = _instrument()
    pipeline = _module("molpredict.training.pipeline", "molpredict.training")
    kernels_base = _module("molpredict.kernels.base")
    warnings.simplefilter("ignore", kernels_base.DegenerateObjectWarning)
    data = Path(args.data)
    known = pipeline.TrainOptions.__dataclass_fields__
    calibration = {"calibration_candidates": list(args.calibration_candidates)} \
        if args.calibration_candidates and "calibration_candidates" in known else {}
    chosen = {"device": args.device} if args.device else {}
    if args.model:
        chosen["model"] = args.model
    if args.no_fragments:
        chosen["fragments"] = False
    chosen = {k: v for k, v in chosen.items() if k in known}  # an older --reference tree may lack an option
    options = pipeline.TrainOptions(ion_modes=["positive"], val_candidates=list(args.val_candidates),
                                    extra_params=json.loads(args.extra) if args.extra else {}, **calibration,
                                    **chosen)
    resolved = _module("molpredict.engine.device").resolve_device(args.device or "auto")
    if resolved.type == "cuda":
        CLOCK.synchronize = torch.cuda.synchronize
    started = (time.process_time(), time.perf_counter())
    CLOCK._mark = started
    bundle, summary = pipeline.train_bundle([data / "train_pos.mgf"], options, val_paths=[data / "val_pos.mgf"],
                                            progress=False, log=lambda m: print(f"  {m}", file=sys.stderr,
                                                                              flush=True))
    CLOCK._charge()
    total_cpu = time.process_time() - started[0]
    total_wall = time.perf_counter() - started[1]
    stages = {}
    for stage in STAGES:
        cpu = sum(v for k, v in CLOCK.cpu.items() if k[-1] == stage)
        wall = sum(v for k, v in CLOCK.wall.items() if k[-1] == stage)
        stages[stage] = {"cpu_s": cpu, "wall_s": wall, "cpu_share": cpu / total_cpu, "wall_share": wall / total_wall,
                         "calls": CLOCK.calls.get(stage, 0), "peak_rss_mb": CLOCK.peak_kb.get(stage, 0) / 1024}
    model_info = summary["models"]["positive"]
    ranking = (model_info.get("validation") or {}).get("ranking") or {}
    metrics = {variant: {"fused": r.get("fused"), "spectrum_alone": r.get("spectrum_alone"),
                         "weights": r.get("weights"), "out_of_fold_hit@1": r.get("out_of_fold_hit@1"),
                         "ece_out_of_fold": (r.get("calibration") or {}).get("ece_out_of_fold")}
               for variant, r in ranking.items()}
    model = bundle.models["positive"].model
    selection = getattr(model, "selection_", {}) or {}
    points = selection.get("points", [])
    best = points[selection.get("best", 0)] if points else {}
    out = {
        "total_cpu_s": total_cpu, "total_wall_s": total_wall,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "stages": stages,
        "paths": [{"path": list(k), "cpu_s": CLOCK.cpu[k], "wall_s": CLOCK.wall[k]}
                  for k in sorted(CLOCK.cpu, key=lambda k: -CLOCK.cpu[k]) if CLOCK.cpu[k] > 0.05],
        "model_profile": getattr(model, "profile_", {}).get("stages"),
        "grid": [{k: p.get(k) for k in ("lam", "val_loss", "val_mrr")} for p in points],
        "chosen_lam": best.get("lam"),
        "validation": metrics,
        "n_spectra": model_info.get("n_spectra"), "n_structures": model_info.get("n_structures"),
        "summary_timings": summary.get("timings"),
        "uninstrumented": missing,
        "threads": {"torch": torch.get_num_threads()},
        "device": str(resolved),
        "device_name": torch.cuda.get_device_name(resolved) if resolved.type == "cuda" else None,
        "torch_version": torch.__version__,
    }
    Path(args.json_out).write_text(json.dumps(out, indent=1, default=float))


# ------------------------------------------------------------------------------------------------------------
# the parent: before and after back to back
# ------------------------------------------------------------------------------------------------------------
def _run_tree(tree: Path, args: argparse.Namespace, label: str, device: str | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "profile.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--json-out", str(out), "--data", args.data]
        for v in args.val_candidates:
            cmd += ["--val-candidates", v]
        for v in args.calibration_candidates:
            cmd += ["--calibration-candidates", v]
        if args.extra:
            cmd += ["--extra", args.extra]
        if device:
            cmd += ["--device", device]
        if args.model:
            cmd += ["--model", args.model]
        if args.no_fragments:
            cmd += ["--no-fragments"]
        # the tree first, so it wins over an installed copy; any further path (packages put there) kept after it
        path = [str(tree)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), MOLPREDICT_HOME=tmp)
        load_before = os.getloadavg()
        print(f"[{label}] training with {tree} on {device or 'auto'} (load {load_before[0]:.2f})", file=sys.stderr, flush=True)
        subprocess.run(cmd, env=env, check=True)
        result = json.loads(out.read_text())
    result["tree"] = str(tree)
    result["load_before"] = load_before
    result["load_after"] = os.getloadavg()
    return result


def _metric_row(result: dict) -> tuple[float, float]:
    fused = (result["validation"].get("with_prior") or {}).get("fused") or {}
    return fused.get("hit@1", float("nan")), fused.get("mrr", float("nan"))


def markdown(report: dict) -> str:
    runs = report["runs"]
    labels = list(runs)
    lines = ["# Default training, stage by stage", "",
             f"`python benchmarks/train_speed.py` ({report['command']}); {report['machine']}. "
             "train_pos, grid selection and the fusion/calibration on val_pos with both candidate-set files "
             "(what `make demo` trains for the positive mode). CPU seconds are the process's (all its threads); "
             "the load average is the machine's (shared by other sessions).", ""]
    header = "| stage | " + " | ".join(f"{l} CPU s | {l} wall s | {l} share (CPU)" for l in labels) + " |"
    lines += [header, "|---|" + "---:|" * (3 * len(labels))]
    for stage in STAGES:
        cells = []
        for l in labels:
            s = runs[l]["stages"][stage]
            cells += [f"{s['cpu_s']:.1f}", f"{s['wall_s']:.1f}", f"{100 * s['cpu_share']:.1f}%"]
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    cells = []
    for l in labels:
        cells += [f"**{runs[l]['total_cpu_s']:.1f}**", f"**{runs[l]['total_wall_s']:.1f}**", "100%"]
    lines.append("| total | " + " | ".join(cells) + " |")
    lines += ["", "| run | device | peak RSS MB | load before / after | val hit@1 (fused) | val MRR (fused) | "
              "chosen lam |", "|---|---|---:|---|---:|---:|---:|"]
    for l in labels:
        r = runs[l]
        hit, mrr = _metric_row(r)
        device = r.get("device_name") or r.get("device", "cpu")
        lines.append(f"| {l} | {device} | {r['peak_rss_mb']:.0f} | {r['load_before'][0]:.2f} / "
                     f"{r['load_after'][0]:.2f} | {100 * hit:.2f}% | {mrr:.4f} | {r['chosen_lam']} |")
    lines += ["", "Where the time is, nested (exclusive CPU seconds per path of stages, the largest):", ""]
    for l in labels:
        top = [f"{'/'.join(p['path'])} {p['cpu_s']:.1f}" for p in runs[l]["paths"][:8]]
        lines.append(f"- {l}: " + "; ".join(top))
    if "ratios" in report:
        ra = report["ratios"]
        lines += ["", f"after / before: CPU {ra['cpu']:.3f}, wall {ra['wall']:.3f}; validation hit@1 "
                  f"{ra['hit@1_points']:+.2f} points, MRR {ra['mrr_points']:+.2f} points (x100)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="MassBank split directory (train_pos.mgf, val_pos.mgf)")
    parser.add_argument("--val-candidates", action="append", required=True)
    parser.add_argument("--calibration-candidates", action="append", default=[],
                        help="calibration-only candidate sets (make demo: val_mass.json; a tree without the option "
                             "ignores them)")
    parser.add_argument("--reference", default=None, help="tree of the code to compare against (before)")
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]), help="tree timed as after")
    parser.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    parser.add_argument("--extra", default=None, help="JSON of extra model parameters (experiments)")
    parser.add_argument("--device", default=None, help="auto, cpu or cuda for the timed tree (default: auto)")
    parser.add_argument("--reference-device", default=None,
                        help="time this tree on this device as the reference (before), e.g. cpu against --device "
                             "cuda; with --reference, the device of the reference tree")
    parser.add_argument("--model", default=None, help="model spec instead of the default (e.g. dsokr)")
    parser.add_argument("--no-fragments", action="store_true",
                        help="train without the fragmentation terms (their fit and scoring are CPU-only RDKit work, "
                             "the same on any device)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    runs = {}
    if args.reference or args.reference_device:
        runs["before"] = _run_tree(Path(args.reference or args.tree), args, "before", args.reference_device)
    runs["after"] = _run_tree(Path(args.tree), args, "after", args.device)
    gpus = sorted({r["device_name"] for r in runs.values() if r.get("device_name")})
    report = {"command": " ".join(["benchmarks/train_speed.py"] + (argv or sys.argv[1:])),
              "machine": f"{os.cpu_count()} cores" + "".join(f", {g}" for g in gpus), "runs": runs}
    if "before" in runs:
        b, a = runs["before"], runs["after"]
        bh, bm = _metric_row(b)
        ah, am = _metric_row(a)
        report["ratios"] = {"cpu": a["total_cpu_s"] / b["total_cpu_s"], "wall": a["total_wall_s"] / b["total_wall_s"],
                            "hit@1_points": 100 * (ah - bh), "mrr_points": 100 * (am - bm)}
    text = markdown(report)
    print(text)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(report, indent=1, default=float))
        Path(args.out + ".md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
