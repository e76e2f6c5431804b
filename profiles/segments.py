"""Multi-regime alpha-beta: a segmented Hockney fit of a collective's time against message size.

One line t(S) = α + f·S/β (``fit.fit_alpha_beta``) cannot follow a stack that changes regime
with the message size. Message-passing libraries switch protocol (MPI's eager and rendezvous
protocols; NCCL keeps a latency and a bandwidth per algorithm and protocol in
``src/graph/tuning.cc``, prices a call as latency + bytes/bandwidth and runs the cheapest), and a
buffer that outgrows a cache moves at a lower bandwidth. Here every regime is a Hockney line of its
own, fitted to a run of consecutive measured sizes:

- each segment holds at least ``MIN_POINTS_PER_SEGMENT`` sizes and has its own α ≥ 0 and β,
  fitted in relative error as ``fit.fit_alpha_beta`` does;
- the number and places of the breaks minimise Schwarz's criterion with the noise level known,
  Σ_k SSE_k/σ² + p·K·ln n (Yao 1988, "Estimating the number of change-points via Schwarz'
  criterion"), with SSE the relative squared error, K segments of p = 3 parameters (α, β and
  the break) over n sizes, and σ the relative noise estimated from the data (``relative_noise``);
- the minimum is found exactly by Bellman's dynamic programme over the sorted sizes (Bellman 1961,
  "On the approximation of curves by line segments using dynamic programming", CACM 4(6)).

No torch here; numpy through ``fit``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from . import fit

MIN_POINTS_PER_SEGMENT = 3
"""Sizes per regime. Two sizes fix a Hockney line exactly, so a two-point segment would never show
misfit and only the penalty could refuse it; three leave one residual to check the line against."""

PARAMETERS_PER_SEGMENT = 3
"""Free parameters a segment adds to the model: its α, its β and the break that starts it."""

NORMAL_MAD_SCALE = 1.4826
"""σ / MAD for normal errors, 1/Φ⁻¹(3/4) (Hampel 1974, JASA 69(346), the median absolute deviation)."""

RELATIVE_NOISE_FLOOR = 1e-6
"""Smallest relative noise assumed: timers resolve about 1 µs and one call takes under about 1 s,
so no median is known better than this; it also keeps noise-free curves from splitting on rounding."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HockneySegment:
    """One regime: t(S) = latency_s + bus_factor·S/bus_bandwidth_bytes_per_s over its sizes."""

    first_size_bytes: int
    """Smallest measured size fitted to this regime (full buffer, nccl-tests convention)."""
    last_size_bytes: int
    """Largest measured size fitted to this regime."""
    latency_s: float
    """α of this regime, seconds, ≥ 0."""
    bus_bandwidth_bytes_per_s: float | None
    """β of this regime in the bus-bandwidth convention (bytes/s); None = latency only."""
    rms_relative_error: float
    """RMS of (line − measured)/measured over this regime's sizes."""

    def time_s(self, op: str, num_ranks: int, size_bytes: float) -> float:
        """This regime's line at ``size_bytes``, seconds."""
        return fit.alpha_beta_time_s(op, num_ranks, size_bytes, self.latency_s,
                                     self.bus_bandwidth_bytes_per_s)


def relative_noise(sizes_bytes: Sequence[float], times_s: Sequence[float]) -> float:
    """Relative noise σ of the measured medians, estimated without a fitted model.

    Each interior point is compared with the straight line through its two neighbours (in S and
    t, where a Hockney line is straight): the pseudo-residual of Gasser, Sroka & Jennen-Steinmetz
    (Biometrika 73(3), 1986), scaled to unit variance under independent errors and taken relative
    to the point. Their median absolute value times ``NORMAL_MAD_SCALE`` (instead of GSJ's mean
    square) estimates σ while ignoring the few points that sit on a change of regime.
    """
    s, t = np.asarray(sizes_bytes, dtype=float), np.asarray(times_s, dtype=float)
    if len(s) < 3:
        return RELATIVE_NOISE_FLOOR
    a = (s[2:] - s[1:-1]) / (s[2:] - s[:-2])          # weight of the left neighbour
    b = 1.0 - a                                        # weight of the right neighbour
    pseudo = (a * t[:-2] + b * t[2:] - t[1:-1]) / t[1:-1]
    scale = np.sqrt(1.0 + (a * t[:-2] / t[1:-1]) ** 2 + (b * t[2:] / t[1:-1]) ** 2)
    return max(NORMAL_MAD_SCALE * float(np.median(np.abs(pseudo / scale))), RELATIVE_NOISE_FLOOR)


def segment_penalty(noise: float, num_points: int) -> float:
    """Cost of one more segment in relative squared error: p·σ²·ln n (Schwarz's criterion, known σ)."""
    return PARAMETERS_PER_SEGMENT * noise**2 * math.log(num_points)


def fit_segment(op: str, num_ranks: int, sizes_bytes: Sequence[int],
                times_s: Sequence[float]) -> tuple[float, HockneySegment]:
    """One regime through all the given points: (relative SSE, the segment)."""
    latency, bandwidth = fit.fit_alpha_beta(op, num_ranks, sizes_bytes, times_s)
    errors = [(fit.alpha_beta_time_s(op, num_ranks, s, latency, bandwidth) - t) / t
              for s, t in zip(sizes_bytes, times_s)]
    sse = sum(e * e for e in errors)
    return sse, HockneySegment(
        first_size_bytes=int(sizes_bytes[0]), last_size_bytes=int(sizes_bytes[-1]),
        latency_s=latency, bus_bandwidth_bytes_per_s=bandwidth,
        rms_relative_error=math.sqrt(sse / len(errors)))


def fit_segmented(op: str, num_ranks: int, sizes_bytes: Sequence[int],
                  times_s: Sequence[float]) -> tuple[HockneySegment, ...]:
    """The regimes minimising Σ_k SSE_k + K·λ, λ = ``segment_penalty``: Bellman's recurrence.

    OPT(0) = 0 and OPT(j) = min over i ≤ j − m of OPT(i) + SSE(points i..j−1) + λ, with m =
    ``MIN_POINTS_PER_SEGMENT`` (the segmented least-squares recurrence of Bellman 1961). A curve of
    fewer than 2m sizes cannot split and gets one segment. ``fit_segmented_brute_force`` is the
    exhaustive twin.
    """
    _check_sizes(sizes_bytes, times_s)
    n, m = len(sizes_bytes), MIN_POINTS_PER_SEGMENT
    if n < 2 * m:
        return (fit_segment(op, num_ranks, sizes_bytes, times_s)[1],)
    penalty = segment_penalty(relative_noise(sizes_bytes, times_s), n)
    best = [0.0] + [math.inf] * n
    start = [0] * (n + 1)
    pieces: dict[tuple[int, int], tuple[float, HockneySegment]] = {}
    for j in range(m, n + 1):
        for i in range(0, j - m + 1):
            if math.isinf(best[i]):
                continue
            pieces[i, j] = fit_segment(op, num_ranks, sizes_bytes[i:j], times_s[i:j])
            cost = best[i] + pieces[i, j][0] + penalty
            if cost < best[j]:
                best[j], start[j] = cost, i
    out, j = [], n
    while j > 0:
        out.append(pieces[start[j], j][1])
        j = start[j]
    return tuple(reversed(out))


def fit_segmented_brute_force(op: str, num_ranks: int, sizes_bytes: Sequence[int],
                              times_s: Sequence[float]) -> tuple[HockneySegment, ...]:
    """``fit_segmented`` by trying every way to cut the sizes into runs of at least m points.

    Exponential in the number of sizes: a reference for tests on small curves.
    """
    _check_sizes(sizes_bytes, times_s)
    n, m = len(sizes_bytes), MIN_POINTS_PER_SEGMENT
    if n < 2 * m:
        return (fit_segment(op, num_ranks, sizes_bytes, times_s)[1],)
    penalty = segment_penalty(relative_noise(sizes_bytes, times_s), n)
    best_cost, best = math.inf, ()
    for num_cuts in range(n // m):
        for cuts in itertools.combinations(range(m, n - m + 1), num_cuts):
            bounds = (0, *cuts, n)
            if any(hi - lo < m for lo, hi in zip(bounds, bounds[1:])):
                continue
            fitted = [fit_segment(op, num_ranks, sizes_bytes[lo:hi], times_s[lo:hi])
                      for lo, hi in zip(bounds, bounds[1:])]
            cost = sum(sse for sse, _ in fitted) + penalty * len(fitted)
            if cost < best_cost:
                best_cost, best = cost, tuple(seg for _, seg in fitted)
    return best


def segmented_time_s(op: str, num_ranks: int, segments: Sequence[HockneySegment], size_bytes: float) -> float:
    """Seconds at ``size_bytes`` from fitted regimes (sorted by size).

    - Inside a regime's measured sizes: its line; below the first regime, the first line; beyond
      the last, the last line (the regime of the largest messages, with its own β).
    - Between two regimes, where the switch happened is not measured: the slower of the two lines,
      the conservative choice for planning.
    - Then the running maximum over smaller sizes, so a bigger message never takes less time
      (a faster regime after a switch starts where the slower one left off).
    """
    floor = 0.0
    for k, seg in enumerate(segments):
        line = seg.time_s(op, num_ranks, size_bytes)
        if k > 0:
            prev = segments[k - 1]
            if size_bytes < seg.first_size_bytes:
                return max(floor, prev.time_s(op, num_ranks, size_bytes), line)
            floor = max(floor, prev.time_s(op, num_ranks, seg.first_size_bytes))
        if size_bytes <= seg.last_size_bytes:
            return max(floor, line)
    return max(floor, segments[-1].time_s(op, num_ranks, size_bytes))


def _check_sizes(sizes_bytes: Sequence[int], times_s: Sequence[float]) -> None:
    if len(sizes_bytes) == 0 or len(sizes_bytes) != len(times_s):
        raise ValueError(f"a curve needs as many times as sizes and at least one point; got "
                         f"{len(sizes_bytes)} sizes and {len(times_s)} times")
    if any(a >= b for a, b in zip(sizes_bytes, sizes_bytes[1:])):
        raise ValueError(f"message sizes must be strictly increasing to fit regimes; got {list(sizes_bytes)}")
