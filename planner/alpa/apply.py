"""Apply a ``tp_plan`` with ``parallelize_module``: the code lives in ``planner/runtime/tp_styles.py``
(the generated job copies the runtime package, so it applies plans without autoplan installed)."""

from planner.runtime.tp_styles import STYLES, apply_tp_plan, parallel_styles, parse_style

__all__ = ["STYLES", "apply_tp_plan", "parallel_styles", "parse_style"]
