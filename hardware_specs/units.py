"""Unit constants: the only place a unit is spelled as a number.

Everything inside autoplan is in base units (bytes, seconds, FLOPs, bytes/s).
Loaders convert suffixed file keys (``memory_gib``, ``bandwidth_gb_per_s``)
with these constants once, where the value enters.
"""

KIB = 2**10
MIB = 2**20
GIB = 2**30
"""Binary byte multiples (bytes)."""

KB = 10**3
MB = 10**6
GB = 10**9
TB = 10**12
"""Decimal byte multiples (bytes), as used by datasheets for bandwidth."""

GBIT = 10**9 / 8
"""One gigabit, in bytes: network datasheets quote Gb/s."""

TERA = 10**12
"""FLOP multiple: datasheets quote TFLOP/s."""

MEGA = 10**6
"""Frequency multiple: datasheets quote clocks in MHz."""

US = 1e-6
MS = 1e-3
"""Time multiples (seconds)."""
