"""The shipped calibration has one home (``costmodels.calibration``): the generated modules are what
its writer writes for the fitting scripts, and the defaults apply all three fits."""

import sys
from pathlib import Path

from costmodels.assumptions import DEFAULT_ASSUMPTIONS, UNCALIBRATED
from costmodels.calibration import (CALIBRATION_MODULE, DEVICE_CONSTANTS, MEMORY_CALIBRATION_MODULE,
                                    MEMORY_CONSTANTS, SHIPPED_CALIBRATION, STEP_CONSTANTS, module_text)

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))


def test_generated_modules_are_what_the_fitting_scripts_write():
    import calibrate
    import memory_fit

    assert CALIBRATION_MODULE.read_text() == module_text(calibrate.MODULE_DOCSTRING, STEP_CONSTANTS)
    assert MEMORY_CALIBRATION_MODULE.read_text() == module_text(memory_fit.MODULE_DOCSTRING, MEMORY_CONSTANTS)


def test_defaults_apply_the_three_fits_which_set_disjoint_fields():
    fits = (DEVICE_CONSTANTS, STEP_CONSTANTS, MEMORY_CONSTANTS)
    assert sum(map(len, fits)) == len(set().union(*fits))
    assert SHIPPED_CALIBRATION == {**DEVICE_CONSTANTS, **STEP_CONSTANTS, **MEMORY_CONSTANTS}
    assert DEFAULT_ASSUMPTIONS == UNCALIBRATED.with_calibration(DEVICE_CONSTANTS).with_calibration(
        STEP_CONSTANTS).with_calibration(MEMORY_CONSTANTS)
    for name, value in SHIPPED_CALIBRATION.items():
        assert getattr(DEFAULT_ASSUMPTIONS, name) == value
