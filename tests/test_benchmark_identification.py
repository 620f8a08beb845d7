"""Smoke test of ``benchmarks/identification.py --quick``: it runs end to end on the shared data and writes sane
JSON, markdown and plots."""
from __future__ import annotations

import json
import math

import pytest

from conftest import load_benchmark, require_shared

pytestmark = pytest.mark.shared


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    data = require_shared()
    for name in ("massbank/train_pos.mgf", "massbank/train_neg.mgf", "candidates/test_formula256.json"):
        require_shared(*name.split("/"))
    out = tmp_path_factory.mktemp("bench")
    bench = load_benchmark("identification")
    assert bench.main(["--out", str(out), "--quick", "--data", str(data), "--n-boot", "200"]) == 0
    return out, json.loads((out / "results.json").read_text())


def test_outputs_exist(quick_run):
    out, results = quick_run
    for name in ("results.json", "results.md", "sketch_size.png", "topk_formula256.png", "topk_formula.png",
                 "topk_mass.png"):
        path = out / name
        assert path.is_file() and path.stat().st_size > 0, name
    assert (out / "sketch_size.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (out / "results.md").read_text()
    assert "| method |" in markdown and "test_formula256.json" in markdown and "Negative mode" in markdown


def test_numbers_are_sane(quick_run):
    _, results = quick_run
    assert results["quick"] is True
    for mode in ("positive", "negative"):
        methods = results[mode]["methods"]
        assert {"random", "prior", "sisokr"} <= set(methods)
        for label, record in methods.items():
            assert "error" not in record, (mode, label, record.get("error"))
            assert record["fit_s"] >= 0 and record["fit_peak_rss_gb"] > 0
            for name, m in record["results"].items():
                assert m["n_queries"] == results[mode]["data"][name]["n_queries"] > 0
                for key in ("hit@1", "hit@5", "hit@10", "hit@20", "mrr"):
                    assert 0.0 <= m[key] <= 1.0 and not math.isnan(m[key])
                assert m["hit@1"] <= m["hit@5"] <= m["hit@10"] <= m["hit@20"]
                low, high = m["ci95"]["hit@1"]
                assert low <= m["hit@1"] <= high
                assert m["identify_s"] >= 0
        # the random baseline is exactly the random-ranking expectation (average tie policy)
        for name, m in methods["random"]["results"].items():
            for key in ("hit@1", "hit@10", "mrr"):
                assert m["average_ties"][key] == pytest.approx(m["random"][key], abs=1e-12)
        # the prior ignores spectra but still beats random on the padded formula sets
        prior = methods["prior"]["results"]["formula256"]
        assert prior["hit@1"] > prior["random"]["hit@1"]
    # a learned spectrum model beats random on the hard protocol even in the quick run
    sisokr = results["positive"]["methods"]["sisokr"]["results"]["formula256"]
    assert sisokr["hit@1"] > 1.5 * sisokr["random"]["hit@1"]
    assert {a["aim"] for a in results["aims"]} >= {"sisokr hit@1 >= 2x prior"}


def test_resume_reruns_only_the_missing_methods(quick_run, tmp_path):
    out, results = quick_run
    resumed_out = tmp_path / "resumed"
    resumed_out.mkdir()
    cut = json.loads((out / "results.json").read_text())
    del cut["positive"]["methods"]["random"]                      # as if the budget had stopped before it
    cut["negative"]["methods"]["prior"] = {"model": "prior", "skipped": "time budget (1 min) spent"}
    (resumed_out / "results.json").write_text(json.dumps(cut))
    bench = load_benchmark("identification")
    assert bench.main(["--out", str(resumed_out), "--quick", "--data", str(require_shared()), "--n-boot", "200",
                       "--resume"]) == 0
    again = json.loads((resumed_out / "results.json").read_text())
    assert (resumed_out / "results.previous.json").is_file()
    for mode in ("positive", "negative"):
        assert set(again[mode]["methods"]) == set(results[mode]["methods"])
    # kept records are the first run's own (same timings); the missing and the skipped ones ran again
    for label in ("sisokr", "prior"):
        kept, first = again["positive"]["methods"][label], cut["positive"]["methods"][label]
        assert (kept["fit_s"], kept["started_min"]) == (first["fit_s"], first["started_min"])
        assert kept["results"]["formula256"]["hit@1"] == first["results"]["formula256"]["hit@1"]
    assert "results" in again["positive"]["methods"]["random"]
    assert "results" in again["negative"]["methods"]["prior"]
    assert again["resumed"]["kept"]["positive"] == sorted(set(cut["positive"]["methods"]))
    assert "Resumed run" in (resumed_out / "results.md").read_text()
