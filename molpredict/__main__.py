"""``python -m molpredict`` runs the CLI."""
from molpredict.cli import main

if __name__ == "__main__":  # not when a spawned worker process (--cluster local:N) re-imports this module
    main()
