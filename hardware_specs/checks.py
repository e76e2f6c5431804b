"""Range checks for numbers where they enter a spec: finite, in a physical range, the right type.

``nan`` passes every ``<= 0`` test and ``inf`` turns into an ``OverflowError`` at the first
``int()``, so each number is checked here once, with the field named, before anything uses it.
The ceilings are far above any real machine; they stop typos and corrupt files, not hardware.
"""

from __future__ import annotations

import math
from numbers import Real

from autoplan_base.errors import SpecError

MAX_GPUS = 2**24
"""Largest job accepted: 16,777,216 devices (a thousand times today's largest clusters)."""
MAX_DEVICES_PER_NODE = 1024
MAX_RATE = 1e21
"""Ceiling for any rate in base units (FLOP/s, bytes/s): a zetta-unit per second."""
MAX_MEMORY_BYTES = 2**50
"""Ceiling for one device's memory: 1 PiB."""
MAX_LATENCY_S = 10.0
MAX_SOLVER_TIME_S = 7 * 24 * 3600
"""Longest solver time limit accepted (``shard --time-limit``): a week; more is a typo."""


def finite(field: str, value: object, *, low: float = 0.0, high: float, low_open: bool = True,
           error: type[SpecError] = SpecError) -> float:
    """``value`` as a float, if it is a real number in (low, high] (or [low, high])."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise error(f"{field} must be a number, got {value!r}")
    number = float(value)
    below = number <= low if low_open else number < low
    if not math.isfinite(number) or below or number > high:
        bracket = "(" if low_open else "["
        raise error(f"{field} must be a finite number in {bracket}{low:g}, {high:g}], got {value!r}")
    return number


def whole(field: str, value: object, *, low: int = 1, high: int, error: type[SpecError] = SpecError) -> int:
    """``value`` as an int, if it is a whole number in [low, high] (``4.0`` is accepted as 4)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise error(f"{field} must be a whole number, got {value!r}")
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        raise error(f"{field} must be a whole number, got {value!r}")
    number = int(value)
    if not low <= number <= high:
        raise error(f"{field} must be a whole number from {low} to {high}, got {value!r}")
    return number


# Ceilings for a training job and a model (far above any trained model, below what overflows a
# float64 cost term or makes the search space explode).
MAX_TOKENS_PER_STEP = 2**40
"""Global batch x sequence length: about 10^12 tokens per optimizer step."""
MAX_SEQ_LEN = 2**27
"""Tokens per sequence: 134 M."""
MAX_LAYERS = 2**10
"""Transformer blocks: 8 x the deepest trained models (Llama 3 405B has 126); the pipeline search
and the stage DP grow with the layer count, and at 2^10 a plan still takes seconds."""
MAX_WIDTH = 2**24
"""Hidden size, FFN hidden size, head dimension and vocabulary size: 16.7 M elements."""
MAX_HEADS = 2**16
MAX_EXPERTS = 2**16


def flag(field: str, value: object, *, error: type[SpecError] = SpecError) -> bool:
    """``value`` if it is a bool (not 1, "yes" or None)."""
    if not isinstance(value, bool):
        raise error(f"{field} must be true or false, got {value!r}")
    return value


def text(field: str, value: object, *, error: type[SpecError] = SpecError) -> str:
    """``value`` if it is a string."""
    if not isinstance(value, str):
        raise error(f"{field} must be a string, got {value!r}")
    return value
