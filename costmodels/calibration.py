"""The shipped calibration: where it is kept, what the cost model applies, and how it is written.

Three fits ship with the model, each as a generated module (importing it reads no file) beside a
JSON provenance record (command, date, grid, figures and residuals):

- kernels: ``device_calibration_data.py`` and ``data/device_calibration.json``
  (``benchmarks/device_kernels.py --write``), the GEMM and attention constants fitted on one lent
  device's kernel times (``planner.published.device_kernels``);

- step time: ``calibration_data.py`` and ``data/calibration.json`` (``benchmarks/calibrate.py
  --write``), whose ``lofo_residuals`` also give the step band (``bands.shipped_step_band``);
- memory: ``memory_calibration_data.py`` and ``data/memory_calibration.json``
  (``benchmarks/memory_fit.py --write``), the allocator constant and the memory band's upper edge.

``SHIPPED_CALIBRATION`` is all three, keyed by ``Assumptions`` field names; ``assumptions.DEFAULT_ASSUMPTIONS``
applies it over the documented defaults, and a profile's own ``calibration`` table (``validate
--calibrate``) overrides it field by field (``context.CostContext``). The fitting itself lives in
``planner.published.calibration``.
"""

from __future__ import annotations

from pathlib import Path

from .calibration_data import CONSTANTS as STEP_CONSTANTS
from .device_calibration_data import CONSTANTS as DEVICE_CONSTANTS
from .memory_calibration_data import CONSTANTS as MEMORY_CONSTANTS

HERE = Path(__file__).parent
CALIBRATION_MODULE = HERE / "calibration_data.py"
CALIBRATION_FILE = HERE / "data" / "calibration.json"
"""Provenance record of the shipped step-time calibration; its ``provenance.lofo_residuals`` give
the step-time band."""
DEVICE_CALIBRATION_MODULE = HERE / "device_calibration_data.py"
DEVICE_CALIBRATION_FILE = HERE / "data" / "device_calibration.json"
"""Provenance record of the kernel constants fitted on a device's kernel times."""
MEMORY_CALIBRATION_MODULE = HERE / "memory_calibration_data.py"
MEMORY_CALIBRATION_FILE = HERE / "data" / "memory_calibration.json"
"""Memory calibration record: the held-out memory residuals behind the memory band."""

SHIPPED_CALIBRATION: dict[str, float] = {**DEVICE_CONSTANTS, **STEP_CONSTANTS, **MEMORY_CONSTANTS}
"""Every shipped constant, by ``Assumptions`` field name (the three fits set disjoint fields)."""


def module_text(docstring: str, constants: dict[str, float]) -> str:
    """Source of a generated calibration module: ``docstring``, then ``CONSTANTS`` sorted by name."""
    lines = "".join(f'    "{k}": {float(v)!r},\n' for k, v in sorted(constants.items()))
    return f'"""{docstring}"""\n\nCONSTANTS: dict[str, float] = {{\n{lines}}}\n'


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, so a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
