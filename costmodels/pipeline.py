"""Pipeline schedules: micro-batches in flight per rank and the bubble.

GPipe (Huang et al. 2019) runs all m forwards before the backwards: every rank holds m
micro-batches. 1F1B / PipeDream-Flush (Narayanan et al. 2021): rank i of p holds min(p - i, m).
Interleaved 1F1B (Narayanan et al. SC'21, Sec. 2.2): rank i warms up 2(p - i - 1) + (v - 1)p
chunk-forwards, so it holds that many plus one chunk-micro-batches, min m·v; on rank 0 this is
L/p layers × (1 + (p-1)/(p·v)) micro-batches' worth (Korthikanti et al. 2022, Sec. 4.2.3).

Step time with per-rank micro-batch times t_i (Alpa, Zheng et al. OSDI'22, Sec. 5.2):
T = Σ_i t_i + (m - 1)·max_j t_j for GPipe and 1F1B; with v chunks per rank the fill and drain
shrink v-fold: bubble = (Σ_i t_i - max_j t_j)/v, which is (p-1)/(v·m) of the ideal time
m·max_j t_j when stages are equal.
"""

from __future__ import annotations


def in_flight_microbatches(schedule: str, pp: int, rank: int, m: int, v: int) -> int:
    """Micro-batches (interleaved: chunk-micro-batches) whose activations rank ``rank`` holds at peak."""
    if pp == 1:
        return 1
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(pp - rank, m)
    return min(2 * (pp - rank - 1) + (v - 1) * pp + 1, m * v)


def bubble_time_s(rank_times_s: list[float], v: int, counts: list[int] | None = None) -> float:
    """Pipeline fill and drain: (Σ_i t_i - max_j t_j) / v seconds.

    ``counts``: how many ranks have each time (ranks with equal work are passed once)."""
    weights = counts or [1] * len(rank_times_s)
    total = sum(t * n for t, n in zip(rank_times_s, weights))
    return (total - max(rank_times_s)) / v


def uniform_bubble_fraction(pp: int, m: int, v: int = 1) -> float:
    """Bubble over ideal time for equal stages: (p - 1)/(v·m) (Narayanan et al. SC'21, eq. 1 and 2)."""
    return (pp - 1) / (v * m)
