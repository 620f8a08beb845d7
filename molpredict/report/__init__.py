"""Stage: reporting. The self-contained HTML page of an identification run (``page``; its template in
``templates/``).

May import: everything below it (identification, chem, spectra, io); never training, data or cli.
"""
