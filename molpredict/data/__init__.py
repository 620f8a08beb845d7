"""Stage: data sets. MassBank import, structure-disjoint split and resumable fetch (``massbank``),
description/SMILES pair tables (``text_pairs``) and the ``make demo`` pipeline (``demo``).

May import: everything below it (training and identification included); never cli.
"""
