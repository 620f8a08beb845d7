"""benchmarks/evidence.py: its rows come from the evaluation's views in a fixed order, and its markdown states
every row with its interval and the calibration."""
from __future__ import annotations

from conftest import load_benchmark


def _block(h1, h10, mrr):
    return {"hit@1": h1, "hit@5": (h1 + h10) / 2, "hit@10": h10, "hit@20": h10, "mrr": mrr,
            "ci95": {"hit@1": [h1 - 0.01, h1 + 0.01], "hit@10": [h10 - 0.01, h10 + 0.01], "mrr": [mrr, mrr]}}


def test_rows_and_markdown():
    bench = load_benchmark("evidence")
    result = {**_block(0.40, 0.85, 0.52), "n_queries": 10, "candidates": {"median": 256.0}, "evaluate_s": 3.0,
              "views": {"spectrum_alone": _block(0.33, 0.66, 0.44), "prior_alone": _block(0.29, 0.78, 0.45),
                        "without_prior": _block(0.35, 0.7, 0.46)},
              "calibration": {"ece": 0.04, "mean_probability": 0.41, "accuracy": 0.40,
                              "confident_at_fdr": {"n_queries": 3, "observed_fdr": 0.0}}}
    rows = bench.rows(result)
    assert [r["row"] for r in rows] == ["fused", "spectrum evidence (--prior off)", "spectrum model alone",
                                        "prior alone"]  # no fragments view: no row
    assert rows[0]["hit@1"] == 0.40 and rows[2]["hit@10"] == 0.66
    text = bench.markdown({"machine": "test", "runs": {"positive/evidence": {"fit_s": 12.0,
                                                                            "files": {"formula256": result}}}})
    assert "| fused | 40.0 [39.0, 41.0] | 62.5 | 85.0 | 85.0 | 0.520 |" in text
    assert "| prior alone | 29.0 [28.0, 30.0]" in text
    assert "ECE 0.040" in text and "3 queries confident" in text
