"""``check_predicted``: the ``predicted`` object of a plan file, checked field by field on read.

What ``explain``, ``launch`` and ``validate`` read of a plan's prediction (``CostBreakdown.predicted_dict``,
``planner.plan.report``'s band) must be there with the right kind, so that a hand-edited or truncated
file fails in one line naming the field (exit 2), not halfway through a report. Numbers are finite
JSON numbers, never booleans.
"""

from __future__ import annotations

import json
import math
from typing import Any

from autoplan_base.errors import AutoplanError

NUMBERS = ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "hfu", "peak_memory_gib",
           "memory_capacity_gib", "bubble_fraction")
"""Required numbers."""
OPTIONAL_NUMBERS = ("memory_usable_gib", "mfu_low_precision_peak", "memory_band_upper", "grads_freed_gib",
                    "host_memory_gib_per_node", "host_memory_capacity_gib")
"""Numbers that may be absent or null (plan files of earlier releases hold ``memory_usable_gib`` null)."""
RANGES = (("step_time_s", 1e-9, 1e9), ("tokens_per_s", 0.0, 1e18), ("tokens_per_s_per_gpu", 0.0, 1e18),
          ("mfu", 0.0, 10.0), ("hfu", 0.0, 10.0), ("peak_memory_gib", 0.0, 1e9), ("memory_capacity_gib", 0.0, 1e9),
          ("bubble_fraction", 0.0, 1.0))
"""What each required number can be: a step takes some time and less than 30 years; rates, memory
and fractions are not negative (MFU up to 10: an FP8 plan's MFU is against the BF16 peak)."""
NUMBER_MAPS = ("memory_gib", "time_s", "comm_gib_per_gpu")
"""Required objects of {name: number}."""
OPTIONAL_NUMBER_MAPS = ("overhead_gib", "buffers_gib")
GOODPUT_NUMBERS = ("checkpoint_every_steps",)
"""What the framework jobs read of ``goodput`` (their checkpoint interval)."""
BAND_NUMBERS = ("low", "high", "half_width_rel")
"""The numbers of a band's bounds (``costmodels.bands.Band.to_dict``)."""


def _fail(path: str, expected: str, value: Any, error: type[AutoplanError]) -> None:
    raise error(f"{path}: expected {expected}, got {json.dumps(value)[:60]}; regenerate the plan with "
                "'autoplan plan --out'")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_band(band: Any, where: str, error: type[AutoplanError]) -> None:
    if not isinstance(band, dict):
        _fail(where, "an object", band, error)
    if "memory_risk" in band and not isinstance(band["memory_risk"], bool):
        _fail(f"{where}.memory_risk", "true or false", band["memory_risk"], error)
    for key in ("step_time_s", "peak_memory_gib"):
        bounds = band.get(key)
        if bounds is None:
            continue
        if not isinstance(bounds, dict):
            _fail(f"{where}.{key}", "an object or null", bounds, error)
        for name in BAND_NUMBERS:  # beside them: basis and record, words
            if not _number(bounds.get(name)):
                _fail(f"{where}.{key}.{name}", "a finite number", bounds.get(name), error)


def check_predicted(raw: Any, where: str, error: type[AutoplanError]) -> dict[str, Any]:
    """``raw`` if it is a well-formed ``predicted`` object, else ``error`` naming the first bad field."""
    if not isinstance(raw, dict):
        _fail(where, "an object", raw, error)
    for key in NUMBERS + OPTIONAL_NUMBERS:
        if (key in NUMBERS or raw.get(key) is not None) and not _number(raw.get(key)):
            _fail(f"{where}.{key}", "a finite number" + (" or null" if key in OPTIONAL_NUMBERS else ""),
                  raw.get(key), error)
    for key, low, high in RANGES:
        if not low <= raw[key] <= high:
            raise error(f"{where}.{key}: {raw[key]!r} is outside {low:g} to {high:g}; regenerate the plan with "
                        "'autoplan plan --out'")
    if "fits" in raw and not isinstance(raw["fits"], bool):
        _fail(f"{where}.fits", "true or false", raw["fits"], error)
    for key in NUMBER_MAPS + OPTIONAL_NUMBER_MAPS:
        if key not in raw and key in OPTIONAL_NUMBER_MAPS:
            continue
        value = raw.get(key)
        if not isinstance(value, dict):
            _fail(f"{where}.{key}", "an object of numbers", value, error)
        for name, number in value.items():
            if not _number(number):
                _fail(f"{where}.{key}.{name}", "a finite number", number, error)
    stages = raw.get("memory_gib_per_stage", [])
    if not isinstance(stages, list) or not all(_number(v) for v in stages):
        _fail(f"{where}.memory_gib_per_stage", "a list of numbers", stages, error)
    if raw.get("band") is not None:
        _check_band(raw["band"], f"{where}.band", error)
    if "goodput" in raw:
        goodput = raw["goodput"]
        if not isinstance(goodput, dict) or not all(_number(goodput.get(k)) for k in GOODPUT_NUMBERS):
            _fail(f"{where}.goodput", "an object with checkpoint_every_steps", goodput, error)
    return raw
