"""Pure fitting of measured curves: alpha-beta collectives, monotone log-space curves, throughput.

No torch here: the harness measures, these functions turn medians into models the cost model
can query at any size. numpy only.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np

COLLECTIVE_OPS: tuple[str, ...] = (
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv",
)


def bus_factor(op: str, num_ranks: int) -> float:
    """Bytes on the busiest link per byte of buffer, NCCL-tests' bus-bandwidth factor.

    Source: NVIDIA nccl-tests ``doc/PERFORMANCE.md``: busBW = algBW · 2(n-1)/n for all-reduce,
    · (n-1)/n for all-gather, reduce-scatter and all-to-all, · 1 for broadcast and send/recv.
    ``S`` is the full buffer (all-gather output, reduce-scatter input).
    """
    n = num_ranks
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "send_recv"):
        return 1.0
    raise ValueError(f"unknown collective {op!r}; expected one of {', '.join(COLLECTIVE_OPS)}")


def bus_bandwidth_bytes_per_s(op: str, num_ranks: int, size_bytes: float, time_s: float) -> float:
    """Bus bandwidth of one measurement (bytes/s): bus_factor · S / t (nccl-tests convention)."""
    return bus_factor(op, num_ranks) * size_bytes / time_s


def fit_nonneg_relative(columns: Sequence[Sequence[float]], times_s: Sequence[float]) -> list[float]:
    """Non-negative coefficients c minimising Σ_i ((Σ_j c_j·x_ij − t_i) / t_i)².

    Relative (1/t-weighted) least squares, so small, latency-bound points weigh as much as large
    ones. With three or fewer columns the non-negative optimum is found exactly by solving every
    subset of columns and keeping the best feasible one (the active-set answer, enumerated).
    """
    t = np.asarray(times_s, dtype=float)
    x = np.asarray(columns, dtype=float).T / t[:, None]
    ones = np.ones_like(t)
    best, best_err = [0.0] * x.shape[1], math.inf
    for r in range(1, x.shape[1] + 1):
        for subset in itertools.combinations(range(x.shape[1]), r):
            coef, *_ = np.linalg.lstsq(x[:, subset], ones, rcond=None)
            if np.any(coef < 0):
                continue
            err = float(np.sum((x[:, subset] @ coef - ones) ** 2))
            if err < best_err:
                best_err = err
                best = [0.0] * x.shape[1]
                for j, c in zip(subset, coef):
                    best[j] = float(c)
    return best


def fit_alpha_beta(op: str, num_ranks: int, sizes_bytes: Sequence[float],
                   times_s: Sequence[float]) -> tuple[float, float | None]:
    """Latency α (s) and bus bandwidth β (bytes/s) of t(S) = α + bus_factor·S/β.

    The alpha-beta (Hockney) model in the bus-bandwidth convention: β is directly comparable
    with nccl-tests' busbw column. Fitted in relative error (``fit_nonneg_relative``); β is
    ``None`` when the data show no size dependence (pure latency).
    """
    factor = bus_factor(op, num_ranks)
    alpha, inv_beta = fit_nonneg_relative(
        [[1.0] * len(sizes_bytes), [factor * s for s in sizes_bytes]], times_s)
    return alpha, (1.0 / inv_beta if inv_beta > 0 else None)


def alpha_beta_time_s(op: str, num_ranks: int, size_bytes: float, latency_s: float,
                      bus_bandwidth: float | None) -> float:
    """t(S) = α + bus_factor·S/β, the fitted alpha-beta model evaluated at ``size_bytes``."""
    if bus_bandwidth is None:
        return latency_s
    return latency_s + bus_factor(op, num_ranks) * size_bytes / bus_bandwidth


def isotonic_nondecreasing(values: Sequence[float]) -> list[float]:
    """Least-squares nondecreasing fit by pool-adjacent-violators (Ayer et al., 1955).

    Adjacent blocks that violate the order are merged into their mean until none do.
    """
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, count = blocks.pop()
            prev = blocks[-1]
            prev[0] = (prev[0] * prev[1] + mean * count) / (prev[1] + count)
            prev[1] += count
    out: list[float] = []
    for mean, count in blocks:
        out.extend([mean] * int(count))
    return out


def monotone_log_smooth(times_s: Sequence[float]) -> list[float]:
    """Times made nondecreasing in message size: isotonic regression of log t, mapped back.

    A bigger message never takes less time; measured medians can dip from noise. Working in
    log space keeps a 10 µs point and a 10 ms point on equal footing.
    """
    return [math.exp(v) for v in isotonic_nondecreasing([math.log(t) for t in times_s])]


def interpolate_time_s(sizes_bytes: Sequence[float], times_s: Sequence[float], size_bytes: float,
                       tail_seconds_per_byte: float) -> float:
    """Time at ``size_bytes`` from a nondecreasing curve: linear in (log S, log t) between points.

    Below the smallest measured size the time is the smallest measured time (latency floor);
    above the largest it grows linearly with slope ``tail_seconds_per_byte`` (the fitted
    bus_factor/β). Both keep the result nondecreasing in size.
    """
    s = sizes_bytes
    if size_bytes <= s[0]:
        return float(times_s[0])
    if size_bytes >= s[-1]:
        return float(times_s[-1]) + (size_bytes - s[-1]) * tail_seconds_per_byte
    i = int(np.searchsorted(s, size_bytes, side="right")) - 1
    x0, x1 = math.log(s[i]), math.log(s[i + 1])
    y0, y1 = math.log(times_s[i]), math.log(times_s[i + 1])
    w = (math.log(size_bytes) - x0) / (x1 - x0)
    return math.exp(y0 + w * (y1 - y0))


def tail_seconds_per_byte(op: str, num_ranks: int, sizes_bytes: Sequence[float],
                          times_s: Sequence[float], bus_bandwidth: float | None) -> float:
    """Slope (s/byte) used beyond the largest measured size: bus_factor/β from the fit, or the
    slope of the last measured segment when the fit found no bandwidth term."""
    if bus_bandwidth is not None:
        return bus_factor(op, num_ranks) / bus_bandwidth
    if len(sizes_bytes) < 2:
        return 0.0
    return max(0.0, (times_s[-1] - times_s[-2]) / (sizes_bytes[-1] - sizes_bytes[-2]))


def fit_throughput(flops: Sequence[float], bytes_moved: Sequence[float],
                   times_s: Sequence[float]) -> tuple[float, float | None, float | None]:
    """Overhead (s), compute rate (FLOP/s) and memory rate (bytes/s) of t = t₀ + F/R + B/W.

    A roofline with launch overhead (Williams et al., CACM 2009, summed rather than max'ed so
    the model is linear): efficiency varies with shape through the bytes-per-FLOP ratio and the
    overhead. A rate is ``None`` when its term fitted to zero.

    When neither rate survives (every measured time is overhead-bound, or noise made the times
    flat in work), the model would give every larger shape the same time. The fit then falls
    back to t = F/R through the origin: the rate that best explains the measured points with
    no overhead term, a lower bound on the kernel's real rate since the overhead is charged
    to it.
    """
    t0, inv_r, inv_w = fit_nonneg_relative(
        [[1.0] * len(flops), list(flops), list(bytes_moved)], times_s)
    if inv_r <= 0 and inv_w <= 0:
        return 0.0, _rate_through_origin(flops, times_s), None
    return t0, (1.0 / inv_r if inv_r > 0 else None), (1.0 / inv_w if inv_w > 0 else None)


def _rate_through_origin(work: Sequence[float], times_s: Sequence[float]) -> float:
    """R minimising Σ((W/R − t)/t)² (relative least squares of t = W/R): with a_i = W_i/t_i,
    1/R = Σa_i / Σa_i²."""
    a = [w / t for w, t in zip(work, times_s)]
    return sum(x * x for x in a) / sum(a)


def throughput_time_s(flop_count: float, bytes_moved: float, overhead_s: float,
                      flops_per_s: float | None, bytes_per_s: float | None) -> float:
    """t = t₀ + F/R + B/W, the fitted roofline-with-overhead model (``fit_throughput``)."""
    t = overhead_s
    if flops_per_s is not None:
        t += flop_count / flops_per_s
    if bytes_per_s is not None:
        t += bytes_moved / bytes_per_s
    return t


def rms_relative_error(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Root-mean-square of (predicted − measured)/measured: how well a fit explains its data."""
    errs = [(p - m) / m for p, m in zip(predicted, measured)]
    return math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else 0.0
