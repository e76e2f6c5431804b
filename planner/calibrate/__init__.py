"""Calibrated by the user's own runs: a cluster's training logs in, a few mechanism factors out.

``sources`` reads logs as teams have them (Megatron-LM logs, torchtitan run directories, tables of
runs), ``terms`` costs each logged layout once as the terms the factors scale, ``fit`` fits the
step-time factors (regularised least squares on log step time, bounded, with leave-one-out),
``memory`` the memory factor, and ``workflow`` writes them as a profile that ``plan`` uses. The
factors themselves, one per mechanism, are ``costmodels.calibration_factors``.
"""

from .runs import CalibrationError, LoggedRun
from .workflow import calibrate, write_calibration_profile

__all__ = ["CalibrationError", "LoggedRun", "calibrate", "write_calibration_profile"]
