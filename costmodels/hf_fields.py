"""``Fields``: typed access to a Hugging Face ``config.json``'s fields, each error naming the file and field."""

from __future__ import annotations

from typing import Any

from autoplan_base.errors import SpecError


class Fields:
    """Typed access to a config's fields; each error names the file and the field."""

    def __init__(self, raw: dict[str, Any], where: str) -> None:
        self.raw, self.path = raw, where

    def int(self, key: str, default: int | None = None, *, low: int = 1) -> int:
        value = self.raw.get(key, default)
        if value is None:
            raise SpecError(f"{self.path}: missing field {key!r}")
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            kind = "a positive integer" if low == 1 else f"an integer of at least {low}"
            raise SpecError(f"{self.path}: field {key!r} must be {kind}, got {value!r}")
        return value

    def optional_int(self, key: str, *, low: int = 1) -> int:
        """The field's value, or 0 when it is absent or null."""
        return 0 if self.raw.get(key) is None else self.int(key, low=low)

    def positive_number(self, key: str, default: float) -> float:
        value = self.raw.get(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise SpecError(f"{self.path}: field {key!r} must be a positive number, got {value!r}")
        return float(value)

    def bool(self, key: str, default: bool) -> bool:
        value = self.raw.get(key, default)
        if not isinstance(value, bool):
            raise SpecError(f"{self.path}: field {key!r} must be true or false, got {value!r}")
        return value

    def fail(self, key: str, why: str) -> SpecError:
        return SpecError(f"{self.path}: field {key!r} {why}")
