"""``molpredict candidates`` commands (filled in by its owner)."""
from __future__ import annotations

from . import cli  # noqa: F401
