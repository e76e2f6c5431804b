"""Measured hardware profiles: what a machine delivers, as opposed to its datasheet.

``load_profile(path)`` reads a profile JSON (made by ``autoplan profile``) into a frozen
``HardwareProfile`` whose lookups the cost model calls. Importing this package imports no torch
and reads no file; only ``profiles.harness`` (run under torchrun) imports torch, inside functions.
"""

from .io import load_profile, profile_from_dict, profile_to_dict, write_profile
from .schema import SCHEMA_VERSION, CollectiveCurve, ComputeTable, HardwareProfile, ProfileError

__all__ = [
    "SCHEMA_VERSION", "CollectiveCurve", "ComputeTable", "HardwareProfile", "ProfileError",
    "load_profile", "profile_from_dict", "profile_to_dict", "write_profile",
]
