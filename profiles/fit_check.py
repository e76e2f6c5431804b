"""How well a collective's regimes predict sizes they did not see, judged inside the regimes. Pure.

The full profile measures sizes at √2 steps (``shapes.sqrt2_steps``). The check fits the regimes on
every other size (the powers of two, ``sizes[::2]``) and predicts the sizes in between
(``sizes[1::2]``), but only those whose two fitted neighbours lie in the same regime: a size
between two regimes is where the switch happened, which no fit that never saw it can place (the
reason the previous check, on a powers-of-two grid, could not be met). Where each regime starts
is reported as the pair of adjacent measured sizes that brackets the break: one √2 step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .segments import HockneySegment, fit_segmented, segmented_time_s

HELD_OUT_BAR = 0.25
"""Largest relative error allowed at a held-out size inside a regime (issue 15)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldOut:
    """One held-out size: what the regimes fitted without it predict, and what was measured."""

    size_bytes: int
    predicted_s: float
    measured_s: float
    inside: bool
    """Both fitted neighbours belong to one regime (judged); else it lies on a switch (reported only)."""

    @property
    def error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


def held_out_inside_regimes(op: str, num_ranks: int, sizes_bytes: Sequence[int],
                            times_s: Sequence[float]) -> tuple[tuple[HockneySegment, ...], list[HeldOut]]:
    """Regimes fitted on ``sizes[::2]`` and every interior ``sizes[1::2]`` predicted from them."""
    fit_sizes, fit_times = list(sizes_bytes[::2]), list(times_s[::2])
    regimes = fit_segmented(op, num_ranks, fit_sizes, fit_times)
    out = []
    for i in range(1, len(sizes_bytes) - 1, 2):
        below, above = sizes_bytes[i - 1], sizes_bytes[i + 1]
        inside = any(r.first_size_bytes <= below and above <= r.last_size_bytes for r in regimes)
        out.append(HeldOut(size_bytes=int(sizes_bytes[i]), measured_s=float(times_s[i]), inside=inside,
                           predicted_s=segmented_time_s(op, num_ranks, regimes, sizes_bytes[i])))
    return regimes, out


def boundaries(regimes: Sequence[HockneySegment]) -> list[tuple[int, int]]:
    """Each break between consecutive regimes as (last size of the one before, first size of the next)."""
    return [(a.last_size_bytes, b.first_size_bytes) for a, b in zip(regimes, regimes[1:])]
