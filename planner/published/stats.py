"""Order statistics and rank agreement on small lists (no numpy or scipy needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from costmodels.bands import percentile  # noqa: F401  (one definition; re-exported here)


def median(values: Sequence[float]) -> float:
    """The 50th percentile."""
    return percentile(values, 50)


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's tau-b between two equal-length lists; None when either list is constant.

    tau-b = (C - D) / sqrt((n0 - n1)(n0 - n2)), n0 = n(n-1)/2 pairs, n1 and n2 the pairs tied in
    x and in y (Kendall 1945). O(n²), fine for sweeps of tens of runs.
    """
    if len(x) != len(y):
        raise ValueError("kendall_tau: lists of different length")
    concordant = discordant = ties_x = ties_y = 0
    n = len(x)
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0:
                ties_x += 1
            if dy == 0:
                ties_y += 1
            if dx * dy > 0:
                concordant += 1
            elif dx * dy < 0:
                discordant += 1
    pairs = n * (n - 1) // 2
    denominator = math.sqrt((pairs - ties_x) * (pairs - ties_y))
    if denominator == 0:
        return None
    return (concordant - discordant) / denominator
