"""Choose the output side (kernel width, output sketch size) by decoding on validation data (never on test).

Usage: python benchmarks/output_kernel_width.py [--out DIR] [--gammas auto,1,2,4] [--sizes 4000/2000,4000/none]
                                                   [--size-kernel SPEC] [--mode positive]

The ridge ``lam`` is chosen by validation kernel loss, as in ``molpredict train``; but kernel losses under
different output kernels live in different feature spaces, so they cannot choose the output kernel itself. This
script trains ``sisokr`` at the identification benchmark's reference configuration B (``ppk-losses``,
sub-sampling m_x 2000 / m_y 1000, Gaussian-Tanimoto on Morgan 2048 bits) once per ``gamma`` (and plain
``tanimoto``), and at the training defaults' sizes with and without an output sketch (``--sizes``), on
``train_*.mgf``, and decodes ``val_*.mgf`` against ``val_formula256.json`` and
``val_formula.json``: hit@k and MRR per spectrum, the same protocol as the benchmark's test tables. Writes
``output_kernel_width.json`` and a markdown table under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import identification as bench  # noqa: E402  (the benchmark's data loading and per-method runner)
from molpredict.modelfile import json_ready  # noqa: E402
from molpredict.specs import parse_spec  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench-out" / "output_kernel_width")
    parser.add_argument("--data", type=Path, default=bench.DATA)
    parser.add_argument("--gammas", default="auto,1,2,4")
    parser.add_argument("--tanimoto", action=argparse.BooleanOptionalAction, default=True,
                        help="also plain tanimoto (the gamma -> 0 shape)")
    parser.add_argument("--sizes", default="4000/2000,4000/none",
                        help="m_x/m_y pairs (m_y: a sub-sampling size, 'none' for no output sketch, or a sketch "
                             "spec such as p-sparsified-rademacher:m=2000) trained with --size-kernel")
    parser.add_argument("--size-kernel", default="gaussian-tanimoto:gamma=auto", help="output kernel of --sizes")
    parser.add_argument("--mode", choices=list(bench.MODES), default="positive")
    parser.add_argument("--n-boot", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--table-only", action="store_true", help="rewrite the markdown from the JSON under --out")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    files = ("formula256", "formula")
    if args.table_only:
        table = format_table(json.loads((args.out / "output_kernel_width.json").read_text()), files)
        (args.out / "output_kernel_width.md").write_text(table)
        print(table)
        return 0

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.perf_counter()
    shared = bench.SharedSetSource()
    data = bench.load_mode(args.mode, args.data, shared, quick=False, seed=args.seed, log=log, report_split="val")
    shared.precompute_fingerprints(**bench.SHARED_FP)
    kernels = [f"gaussian-tanimoto:gamma={g}" for g in args.gammas.split(",") if g]
    if args.tanimoto:
        kernels.append("tanimoto")
    rows = [(f"B {spec}", "sisokr", bench._sisokr(2000, 1000, output_kernel=spec)) for spec in kernels]
    for pair in filter(None, args.sizes.split(",")):
        m_x, m_y = pair.split("/")
        spec = args.size_kernel
        params = {"input_sketch": f"subsample:m={m_x}", "output_kernel": spec}
        if m_y == "none":
            rows.append((f"m_x {m_x}, no output sketch, {spec}", "siokr", params))
            continue
        sketch = m_y if ":" in m_y else f"subsample:m={m_y}"  # a whole output sketch spec, or a sub-sampling size
        label = f"m_x {m_x}, output {m_y}" if ":" in m_y else f"m_x {m_x}, m_y {m_y}"
        rows.append((f"{label}, {spec}", "sisokr", {**params, "output_sketch": sketch}))
    results = {"split": "val", "mode": args.mode, "data": data.info, "rows": {}}
    for label, model, params in rows:
        method = bench.Method(label, model, params, "variants", files=files)
        record = bench.run_method(method, data, args.n_boot, args.seed, log)
        results["rows"][label] = record
        (args.out / "output_kernel_width.json").write_text(json.dumps(json_ready(results), indent=1))
    results["wall_s"] = time.perf_counter() - started
    (args.out / "output_kernel_width.json").write_text(json.dumps(json_ready(results), indent=1))
    table = format_table(results, files)
    (args.out / "output_kernel_width.md").write_text(table)
    print(table)
    return 0


def format_table(results: dict, files: tuple[str, ...]) -> str:
    """Markdown: one row per trained model, hit@1 / hit@10 / MRR per candidate file."""
    lines = [f"Decoding val_{bench.MODES[results['mode']]} (hit@k %, MRR; lam by validation kernel loss; B = m_x 2000, "
             "m_y 1000)", "",
             "| model | gamma | fit s | " + " | ".join(f"{f} hit@1 | {f} hit@10 | {f} MRR" for f in files) + " |",
             "|---|---|---:|" + "---:|" * (3 * len(files))]
    for label, record in results["rows"].items():
        resolved = (record.get("selection") or [{}])[0].get("output_kernel_resolved")
        gamma = parse_spec(resolved).params.get("gamma") if resolved else None
        cells = []
        for f in files:
            m = record["results"][f]
            cells += [f"{100 * m['hit@1']:.1f}", f"{100 * m['hit@10']:.1f}", f"{m['mrr']:.3f}"]
        gamma = f"{float(gamma):.3g}" if gamma is not None else "-"
        lines.append(f"| {label} | {gamma} | {record['fit_s']:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
