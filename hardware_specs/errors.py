"""Moved to ``autoplan_base.errors``; this name stays only for code written before the move."""

from autoplan_base.errors import AutoplanError, SpecError

__all__ = ["AutoplanError", "SpecError"]
