"""Identify N spectra by formula against a library, warm store: in-process, then a fresh ``local:2`` cluster (its
first run loads the state; a second run on the warm workers), with whichever tree ``PYTHONPATH`` names (module
paths of the layouts before and after the stage move), so an older tree can be measured back to back with this
one. Prints one JSON line: wall and CPU seconds (the workers' whole processes) and byte-identical outputs.

    for t in OLD_TREE .; do PYTHONPATH=$t python benchmarks/cluster_before_after.py --model MODEL \
        --library POOL --spectra test_pos.mgf --store STORE --n 3000; done
"""
import io, json, os, time, warnings
warnings.simplefilter("ignore")
import psutil

def imports():
    try:
        from molpredict.identification.candidate_sources import LibrarySource
        from molpredict.identification.identify import Identifier, IdentifyOptions
        from molpredict.identification.scoring import DaskExecutor, InProcessExecutor
        from molpredict.chem.candidates import read_library
        from molpredict.io import read_spectra
        try:
            from molpredict.identification.scoring import load_library_once as read_library
        except ImportError:
            pass
    except ImportError:
        from molpredict.candidate_sources import LibrarySource
        from molpredict.identify import Identifier, IdentifyOptions
        from molpredict.scoring import DaskExecutor, InProcessExecutor
        from molpredict.candidates import read_library
        from molpredict.spectra import read_spectra
    from molpredict.io.results import ResultWriter
    from molpredict.modelfile import ModelBundle
    return LibrarySource, Identifier, IdentifyOptions, DaskExecutor, InProcessExecutor, read_library, read_spectra, ResultWriter, ModelBundle

def main():
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--library", required=True)
    parser.add_argument("--spectra", required=True, help="spectra with a FORMULA (repeated up to --n)")
    parser.add_argument("--store", required=True, help="coordinates store root (warmed by the first run)")
    parser.add_argument("--n", type=int, default=3000)
    args = parser.parse_args()
    LibrarySource, Identifier, IdentifyOptions, DaskExecutor, InProcessExecutor, read_library, read_spectra, ResultWriter, ModelBundle = imports()
    n = args.n
    bundle = ModelBundle.load(args.model)
    lib = read_library(args.library)
    base = [s for s in read_spectra(args.spectra) if s.formula]
    spectra = [base[i % len(base)] for i in range(n)]
    options = IdentifyOptions(by="formula", top_k=10)
    def run(ex, sp):
        ident = Identifier(bundle, LibrarySource(lib, options), options, cache_root=args.store)
        buf = io.StringIO(); w = ResultWriter(buf, "tsv")
        c = time.process_time(); t = time.perf_counter()
        for r in ident.run(sp, executor=ex): w.write(r)
        w.close(); return time.perf_counter() - t, time.process_time() - c, buf.getvalue()
    def wcpu(ex):
        def cpu():
            t = psutil.Process().cpu_times(); return t.user + t.system
        return sum(ex.client.run(cpu).values())
    here = InProcessExecutor()
    run(here, spectra)  # warm (library indexes, store pages)
    out = {"tree": os.environ.get("PYTHONPATH"), "n": n, "load_before": os.getloadavg()[0]}
    w, c, ref = run(here, spectra); out["in_process"] = {"wall_s": round(w, 2), "cpu_s": round(c, 2)}
    t = time.perf_counter(); ex = DaskExecutor.connect("local:2"); out["startup_s"] = round(time.perf_counter() - t, 2)
    try:
        c0 = wcpu(ex); w1, _, t1 = run(ex, spectra); c1 = wcpu(ex)
        out["local:2_first_run"] = {"wall_s": round(w1, 2), "worker_cpu_s": round(c1 - c0, 2), "identical": t1 == ref}
        w2, _, t2 = run(ex, spectra); c2 = wcpu(ex)
        out["local:2_second_run"] = {"wall_s": round(w2, 2), "worker_cpu_s": round(c2 - c1, 2), "identical": t2 == ref}
    finally:
        ex.close()
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out), flush=True)

if __name__ == "__main__":
    main()
