"""``python -m molpredict`` runs the CLI."""
from .cli import main

main()
