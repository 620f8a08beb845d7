"""The command line that the benchmarks which rank labelled spectra with one bundle share."""
from __future__ import annotations

import argparse
from pathlib import Path


def bundle_split_parser(description: str, sets: list[str], out: str) -> argparse.ArgumentParser:
    """``--model``, ``--data`` (the shared data directory, given explicitly), ``--mode pos|neg``, ``--split
    val|test`` (val by default: choices are made there), ``--sets`` (candidate-set files ``{split}_{set}.json``) and
    ``--out`` (the JSON written)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--mode", default="pos", choices=("pos", "neg"))
    parser.add_argument("--split", default="val", choices=("val", "test"))
    parser.add_argument("--sets", nargs="+", default=list(sets))
    parser.add_argument("--out", type=Path, default=Path(out))
    return parser
