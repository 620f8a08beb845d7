"""Stage: training. The pipeline of ``molpredict train`` (``pipeline``: read, label, filter, clean, fit per ion
mode, summary) and what is fitted on validation candidate sets at training time (``ranking_validation``: the
fusion weights and the out-of-fold calibration).

May import: everything below it, identification included (validation ranks like identification does); never
report, data or cli.
"""
